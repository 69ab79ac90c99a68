// A Hugging Face tokenizer.json (data/bpe_tokenizer.h); a tokenizer that loads encodes a
// fixed text (added tokens, bytes outside ASCII) and decodes the ids back.
#include "fuzz_util.h"
#include "tessera/data/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::filesystem::path path = fuzz::scratch_dir() / "tokenizer.json";
  fuzz::write_file(path, fuzz::as_text(data, size));
  fuzz::expect_errors([&] {
    const std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer_json(path);
    const std::vector<int32_t> ids = tokenizer->encode("Hello wörld <|endoftext|> 123  tabs\tand\nlines");
    tokenizer->decode(ids);
  });
  return 0;
}
