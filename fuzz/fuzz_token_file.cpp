// Token files (data/token_file.h): header and body. The body hash in the header is set
// to the body's real hash for inputs whose first byte is even, so the fuzzer reaches the
// code past the hash check (a crafted file has a valid hash); odd ones are read as given.
#include <xxhash.h>

#include <cstring>

#include "fuzz_util.h"
#include "tessera/data/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  constexpr size_t kHeaderBytes = 64, kHashAt = 56;
  std::string bytes(fuzz::as_text(data, size));
  if (bytes.size() >= kHeaderBytes && bytes[0] % 2 == 0) {
    bytes[0] = 'T';
    const uint64_t hash = XXH3_64bits(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
    for (int i = 0; i < 8; ++i) bytes[kHashAt + i] = static_cast<char>(hash >> (8 * i));
  }
  const std::filesystem::path path = fuzz::scratch_dir() / "tokens.bin";
  fuzz::write_file(path, bytes);
  fuzz::expect_errors([&] { data::read_token_file_header(path); });
  fuzz::expect_errors([&] {
    const data::TokenFile file(path);
    // A vocabulary from the tokenizer id's length, so both answers of the check happen.
    file.check_vocabulary(static_cast<int64_t>(file.header().tokenizer.size()) * 4099);
    std::vector<int32_t> all(file.size());
    file.read(0, file.size(), all.data());
    if (file.size() > 0) (void)file[file.size() - 1];
  });
  return 0;
}
