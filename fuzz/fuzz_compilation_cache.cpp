// The compilation cache's files (compiler/compilation_cache.h, cache_format.cpp,
// cache_index.cpp): an entry (.tsxc) and an index entry (.tsxi), the input's two
// '\0'-separated fields, written under the names the cache looks up, then listed, loaded
// through the index and directly, and explained. Damage must read as a miss.
#include "fuzz_cache_keys.h"
#include "fuzz_util.h"
#include "tessera/compiler/executable.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view text = fuzz::as_text(data, size);
  const size_t cut = text.find('\0');
  const std::filesystem::path dir = fuzz::scratch_dir();
  const compiler::CacheKey key = fuzz::fuzz_cache_key();
  const compiler::IndexKey index_key = fuzz::fuzz_index_key();
  fuzz::write_file(dir / (key.fingerprint() + ".tsxc"), text.substr(0, cut));
  if (cut != std::string_view::npos) fuzz::write_file(dir / (index_key.fingerprint() + ".tsxi"), text.substr(cut + 1));
  compiler::CompilationCache cache(dir);
  cache.entries();
  cache.load_indexed(index_key, [](const compiler::Executable&, const compiler::IndexEntry&) { return std::string(); });
  cache.load(key);
  cache.explain();
  return 0;
}
