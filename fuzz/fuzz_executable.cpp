// Serialized executables (compiler/executable.h), the compilation cache's payload. For
// inputs whose first byte is even the rest is the body, wrapped in a valid preamble
// (magic, version, length, hash) so the fuzzer explores the graph and memory-plan
// decoders past the hash; odd ones are deserialized as given.
#include <xxhash.h>

#include "fuzz_util.h"
#include "tessera/compiler/executable.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size == 0) return 0;
  const std::string_view rest = fuzz::as_text(data + 1, size - 1);
  std::string bytes;
  if (data[0] % 2 == 0) {
    const uint32_t version = compiler::kExecutableFormatVersion;
    const uint64_t length = rest.size();
    const uint64_t hash = XXH3_64bits(rest.data(), rest.size());
    bytes.assign("TSRX", 4);
    bytes.append(reinterpret_cast<const char*>(&version), sizeof version);
    bytes.append(reinterpret_cast<const char*>(&length), sizeof length);
    bytes.append(reinterpret_cast<const char*>(&hash), sizeof hash);
  }
  bytes += rest;
  fuzz::expect_errors([&] { compiler::Executable::deserialize(bytes); });
  return 0;
}
