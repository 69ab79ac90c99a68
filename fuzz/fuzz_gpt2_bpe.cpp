// GPT-2's tokenizer files (data/bpe_tokenizer.h): vocab.json and merges.txt, the input's
// two '\0'-separated fields; a tokenizer that loads encodes and decodes a fixed text.
#include "fuzz_util.h"
#include "tessera/data/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view text = fuzz::as_text(data, size);
  const size_t cut = text.find('\0');
  if (cut == std::string_view::npos) return 0;
  const std::filesystem::path dir = fuzz::scratch_dir();
  fuzz::write_file(dir / "vocab.json", text.substr(0, cut));
  fuzz::write_file(dir / "merges.txt", text.substr(cut + 1));
  fuzz::expect_errors([&] {
    const std::unique_ptr<data::Tokenizer> tokenizer = data::load_gpt2_bpe(dir);
    tokenizer->decode(tokenizer->encode("Hello world <|endoftext|> ünïcode 42"));
  });
  return 0;
}
