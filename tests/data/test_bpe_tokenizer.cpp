// Byte-level BPE tokenizers (GPT-2 files, Hugging Face tokenizer.json) against the ids of
// Hugging Face tokenizers and tiktoken (which agree on every golden text), decode round
// trips, the make_tokenizer specs, the content fingerprint id() and encode_parallel.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "bpe_test_util.h"
#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/bpe_tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using testing::bpe_fixtures;
using testing::bpe_golden;

void expect_golden(const Tokenizer& tokenizer, const std::string& name, bool round_trip = true) {
  const auto& golden = bpe_golden();
  const auto ids = golden.ids(name);
  ASSERT_EQ(ids.size(), golden.texts.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<int32_t> got = tokenizer.encode(golden.texts[i]);
    EXPECT_EQ(got, ids[i]) << name << " text " << i << ": '" << golden.texts[i] << "'";
    if (round_trip) {
      EXPECT_EQ(tokenizer.decode(got), golden.texts[i]) << name << " text " << i;
    }
  }
}

TEST(BpeTokenizer, Gpt2FilesMatchTokenizersAndTiktoken) {
  const auto tokenizer = load_gpt2_bpe(bpe_fixtures() / "gpt2_style");
  expect_golden(*tokenizer, "gpt2_style");
  EXPECT_EQ(tokenizer->vocab_size(), 1500);
  EXPECT_EQ(tokenizer->eos_id(), 0);  // <|endoftext|>
}

TEST(BpeTokenizer, OpenAiFileNamesGiveTheSameTokenizer) {
  testing::TempDir dir;
  fs::copy_file(bpe_fixtures() / "gpt2_style/vocab.json", dir / "encoder.json");
  fs::copy_file(bpe_fixtures() / "gpt2_style/merges.txt", dir / "vocab.bpe");
  const auto tokenizer = load_gpt2_bpe(dir.path());
  expect_golden(*tokenizer, "gpt2_style");
  EXPECT_EQ(tokenizer->id(), load_gpt2_bpe(bpe_fixtures() / "gpt2_style")->id());
  EXPECT_EQ(load_gpt2_bpe(dir / "encoder.json")->id(), tokenizer->id());  // the JSON file itself
}

TEST(BpeTokenizer, Gpt2StyleTokenizerJsonMatchesGolden) {
  const auto tokenizer = load_tokenizer_json(bpe_fixtures() / "gpt2_style/tokenizer.json");
  expect_golden(*tokenizer, "gpt2_style");
  EXPECT_EQ(tokenizer->eos_id(), 0);
}

TEST(BpeTokenizer, Llama3StyleTokenizerJsonMatchesGolden) {
  const auto tokenizer = load_tokenizer_json(bpe_fixtures() / "llama3_style/tokenizer.json");
  expect_golden(*tokenizer, "llama3_style");
  EXPECT_EQ(tokenizer->vocab_size(), 1504);  // the vocab, then 4 special tokens
  EXPECT_EQ(tokenizer->eos_id(), 1501);      // <|end_of_text|>
}

TEST(BpeTokenizer, AddPrefixSpaceMatchesGolden) {
  // HF only (tiktoken has no such option); decode keeps the added space, so no round trip.
  testing::TempDir dir;
  nlohmann::json json = nlohmann::json::parse(testing::read_bytes(bpe_fixtures() / "gpt2_style/tokenizer.json"));
  json["pre_tokenizer"]["add_prefix_space"] = true;
  testing::write_bytes(dir / "tokenizer.json", json.dump());
  const auto tokenizer = load_tokenizer_json(dir / "tokenizer.json");
  expect_golden(*tokenizer, "gpt2_style_prefix_space", /*round_trip=*/false);
  EXPECT_NE(tokenizer->id(), load_tokenizer_json(bpe_fixtures() / "gpt2_style/tokenizer.json")->id());
}

TEST(BpeTokenizer, DecodeRoundTripsAnyBytes) {
  const auto gpt2 = load_gpt2_bpe(bpe_fixtures() / "gpt2_style");
  const auto llama = load_tokenizer_json(bpe_fixtures() / "llama3_style/tokenizer.json");
  std::mt19937 gen(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string text(static_cast<size_t>(gen() % 200), '\0');
    for (char& c : text) c = static_cast<char>(gen() % 256);  // mostly invalid UTF-8
    EXPECT_EQ(gpt2->decode(gpt2->encode(text)), text);
    EXPECT_EQ(llama->decode(llama->encode(text)), text);
  }
}

TEST(BpeTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const auto tokenizer = load_gpt2_bpe(bpe_fixtures() / "gpt2_style");
  for (const int32_t bad : {1500, -3}) {
    try {
      tokenizer->decode({5, 6, bad});
      FAIL() << "expected ValueError for " << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("id " + std::to_string(bad)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
    }
  }
}

TEST(BpeTokenizer, MakeTokenizerSpecs) {
  const fs::path gpt2_dir = fs::absolute(bpe_fixtures() / "gpt2_style").lexically_normal();
  const fs::path llama_json = fs::absolute(bpe_fixtures() / "llama3_style/tokenizer.json").lexically_normal();
  const auto from_files = make_tokenizer("gpt2:" + gpt2_dir.string());
  EXPECT_EQ(from_files->spec(), "gpt2:" + gpt2_dir.string());
  const auto hf = make_tokenizer("hf:" + llama_json.string());
  EXPECT_EQ(hf->spec(), "hf:" + llama_json.string());
  // A directory is guessed from its files (tokenizer.json first); specs load again.
  const auto guessed = make_tokenizer(llama_json.parent_path().string());
  EXPECT_EQ(guessed->spec(), "hf:" + llama_json.string());
  EXPECT_EQ(guessed->id(), hf->id());
  EXPECT_EQ(make_tokenizer(from_files->spec())->id(), from_files->id());
  const std::string text = bpe_golden().texts[24];
  EXPECT_EQ(make_tokenizer(hf->spec())->encode(text), hf->encode(text));
  // The same vocab and merges with different pre-tokenizers/added tokens: different ids.
  EXPECT_NE(from_files->id(), hf->id());
}

TEST(BpeTokenizer, IdIsAFingerprintOfTheContent) {
  testing::TempDir dir;
  fs::copy(bpe_fixtures() / "gpt2_style", dir / "copy");
  const auto original = load_gpt2_bpe(bpe_fixtures() / "gpt2_style");
  EXPECT_EQ(original->id().rfind("bpe-", 0), 0u) << original->id();
  EXPECT_EQ(original->id().size(), 20u);
  EXPECT_EQ(load_gpt2_bpe(dir / "copy")->id(), original->id());
  EXPECT_EQ(load_tokenizer_json(dir / "copy/tokenizer.json")->id(),
            load_tokenizer_json(bpe_fixtures() / "gpt2_style/tokenizer.json")->id());
  // Drop the last merge: another tokenizer.
  std::string merges = testing::read_bytes(dir / "copy/merges.txt");
  merges.erase(merges.rfind('\n', merges.size() - 2) + 1);
  testing::write_bytes(dir / "copy/merges.txt", merges);
  EXPECT_NE(load_gpt2_bpe(dir / "copy")->id(), original->id());
}

// A few MB of the golden texts in random order with random separators.
std::string large_text(size_t bytes) {
  const auto& texts = bpe_golden().texts;
  std::mt19937 gen(11);
  const char* separators[] = {" ", "\n", "\n\n", "  ", "\t", "\r\n", "", ". ", " 1234 "};
  std::string text;
  while (text.size() < bytes) {
    text += texts[gen() % texts.size()];
    text += separators[gen() % std::size(separators)];
  }
  return text;
}

TEST(BpeTokenizer, EncodeParallelEqualsEncode) {
  const std::string text = large_text(testing::small_tests() ? (1u << 19) : (3u << 20));
  for (const fs::path& file :
       {bpe_fixtures() / "gpt2_style/tokenizer.json", bpe_fixtures() / "llama3_style/tokenizer.json"}) {
    const auto tokenizer = load_tokenizer_json(file);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> sequential = tokenizer->encode(text);
    const auto t1 = std::chrono::steady_clock::now();
    for (const int threads : {2, 4, 7}) EXPECT_EQ(tokenizer->encode_parallel(text, threads), sequential) << file;
    std::printf("%s: %zu bytes -> %zu tokens, encode %.0f ms\n", file.parent_path().filename().c_str(), text.size(),
                sequential.size(), std::chrono::duration<double, std::milli>(t1 - t0).count());
    EXPECT_EQ(tokenizer->decode(sequential), text);
  }
}

TEST(BpeTokenizer, LongPiecesAreNotQuadratic) {
  // Single pieces of 200k bytes (digits for GPT-2's \p{N}+, a letter run, emoji) take
  // milliseconds (the heap merge); a quadratic merge loop would take minutes.
  const auto tokenizer = load_gpt2_bpe(bpe_fixtures() / "gpt2_style");
  for (const std::string unit : {"1", "ab", "\xF0\x9F\x98\x80"}) {
    std::string text;
    while (text.size() < 200000) text += unit;
    const auto ids = tokenizer->encode(text);
    EXPECT_LE(ids.size(), text.size());
    EXPECT_EQ(tokenizer->decode(ids), text);
  }
}

}  // namespace
}  // namespace tessera::data
