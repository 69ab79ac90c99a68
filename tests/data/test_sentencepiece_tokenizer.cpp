// The SentencePiece tokenizer against pip's sentencepiece 0.1.97 (the goldens of
// tests/oracles/sentencepiece_model.py on the committed fixture model): ids, decoded
// text, the fingerprint id, make_tokenizer's spellings, and the errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/sentencepiece_tokenizer.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using tessera::testing::read_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;

const fs::path kFixtureDir = fs::path(TESSERA_SOURCE_DIR) / "tests/data/fixtures/tokenizers/spm";
const fs::path kModel = kFixtureDir / "tokenizer.model";

nlohmann::json golden() {
  return nlohmann::json::parse(
      read_bytes(fs::path(TESSERA_SOURCE_DIR) / "tests/oracles/goldens/sentencepiece_model.json"));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SentencePieceTokenizer, MatchesPipSentencePiece) {
  const nlohmann::json g = golden();
  const auto tokenizer = load_sentencepiece(kModel);
  EXPECT_EQ(tokenizer->vocab_size(), g["vocab_size"].get<int64_t>());
  ASSERT_TRUE(tokenizer->eos_id().has_value());
  EXPECT_EQ(*tokenizer->eos_id(), g["eos_id"].get<int32_t>());
  ASSERT_GE(g["cases"].size(), 10u);
  bool byte_fallback_seen = false;
  for (const nlohmann::json& c : g["cases"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"];
    EXPECT_EQ(tokenizer->encode(text), want) << "text: " << text;
    EXPECT_EQ(tokenizer->decode(want), c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tokenizer->encode_parallel(text, 4), want) << "text: " << text;
    for (const std::string piece : c["pieces"]) byte_fallback_seen |= piece.starts_with("<0x");
  }
  EXPECT_TRUE(byte_fallback_seen) << "the goldens should exercise byte fallback";
}

TEST(SentencePieceTokenizer, IdAndSpec) {
  const auto tokenizer = load_sentencepiece(kModel);
  const std::string id = tokenizer->id();
  EXPECT_EQ(id.size(), 4u + 16u) << id;
  EXPECT_TRUE(id.starts_with("spm-")) << id;
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos) << id;
  EXPECT_EQ(tokenizer->spec(), "spm:" + kModel.string());

  // The id is the content's: a copy elsewhere has the same id, another spec; one
  // changed byte of the model gives another id.
  TempDir dir;
  fs::copy_file(kModel, dir / "copy.model");
  const auto copy = load_sentencepiece(dir / "copy.model");
  EXPECT_EQ(copy->id(), id);
  EXPECT_EQ(copy->spec(), "spm:" + (dir / "copy.model").string());
  const auto again = make_tokenizer(copy->spec());
  EXPECT_EQ(again->id(), id);
  // An unknown protobuf field (number 100, varint 1) appended: still a loadable model
  // with the same pieces, but other bytes.
  write_bytes(dir / "changed.model", read_bytes(kModel) + "\xA0\x06\x01");
  const auto changed = load_sentencepiece(dir / "changed.model");
  EXPECT_EQ(changed->encode("Hello"), copy->encode("Hello"));
  EXPECT_NE(changed->id(), id);
}

TEST(SentencePieceTokenizer, MakeTokenizerSpellings) {
  const std::string id = load_sentencepiece(kModel)->id();
  EXPECT_EQ(make_tokenizer("spm:" + kModel.string())->id(), id);
  EXPECT_EQ(make_tokenizer(kModel.string())->id(), id);       // bare *.model path
  EXPECT_EQ(make_tokenizer(kFixtureDir.string())->id(), id);  // a directory with tokenizer.model
  EXPECT_EQ(make_tokenizer("spm:" + kFixtureDir.string())->id(), id);
  // A relative path is resolved against the current directory; spec() is absolute.
  const fs::path cwd = fs::current_path();
  fs::current_path(kFixtureDir.parent_path());
  const auto relative = make_tokenizer("spm:spm/tokenizer.model");
  fs::current_path(cwd);
  EXPECT_EQ(relative->id(), id);
  EXPECT_EQ(relative->spec(), "spm:" + kModel.string());
}

// A Hugging Face directory of a SentencePiece model (Llama 2, Mistral) ships a converted
// tokenizer.json (Metaspace, byte fallback: not byte-level) beside tokenizer.model: the
// directory means the SentencePiece model. A byte-level tokenizer.json still wins.
TEST(SentencePieceTokenizer, DirectoryWithBothFilesPicksByJsonKind) {
  TempDir dir;
  fs::copy_file(kModel, dir.path() / "tokenizer.model");
  write_bytes(dir.path() / "tokenizer.json",
              R"({"model": {"type": "BPE", "byte_fallback": true}, "pre_tokenizer": {"type": "Metaspace"}})");
  EXPECT_EQ(make_tokenizer(dir.path().string())->id(), load_sentencepiece(kModel)->id());
  const fs::path byte_level = fs::path(TESSERA_SOURCE_DIR) / "tests/data/fixtures/tokenizers/gpt2_style/tokenizer.json";
  fs::copy_file(byte_level, dir.path() / "tokenizer.json", fs::copy_options::overwrite_existing);
  EXPECT_EQ(make_tokenizer(dir.path().string())->id(), make_tokenizer("hf:" + byte_level.string())->id());
}

TEST(SentencePieceTokenizer, RejectsFilesThatAreNotModels) {
  TempDir dir;
  write_bytes(dir / "text.model", "this is not a protobuf, just some text\n");
  std::string message = error_of([&] { load_sentencepiece(dir / "text.model"); });
  EXPECT_NE(message.find((dir / "text.model").string()), std::string::npos) << message;
  EXPECT_NE(message.find("not a model"), std::string::npos) << message;
  EXPECT_THROW(load_sentencepiece(dir / "text.model"), IOError);

  write_bytes(dir / "empty.model", "");
  EXPECT_THROW(load_sentencepiece(dir / "empty.model"), IOError);

  // Half a model: the protobuf is cut short.
  const std::string model = read_bytes(kModel);
  write_bytes(dir / "half.model", model.substr(0, model.size() / 2));
  message = error_of([&] { make_tokenizer("spm:" + (dir / "half.model").string()); });
  EXPECT_NE(message.find("half.model"), std::string::npos) << message;

  message = error_of([&] { load_sentencepiece(dir / "missing.model"); });
  EXPECT_NE(message.find("missing.model"), std::string::npos) << message;
  EXPECT_NE(message.find("no such file"), std::string::npos) << message;
  EXPECT_THROW(make_tokenizer("spm:" + (dir / "missing.model").string()), IOError);
  EXPECT_THROW(load_sentencepiece(dir.path()), IOError);  // a directory
}

TEST(SentencePieceTokenizer, RejectsIdsOutsideTheVocabulary) {
  const auto tokenizer = load_sentencepiece(kModel);
  const int32_t vocab = static_cast<int32_t>(tokenizer->vocab_size());
  std::string message = error_of([&] { tokenizer->decode({5, 6, vocab}); });
  EXPECT_NE(message.find(fmt::format("id {} at position 2", vocab)), std::string::npos) << message;
  EXPECT_THROW(tokenizer->decode({-1}), ValueError);
  message = error_of([&] { tokenizer->decode({7, -3}); });
  EXPECT_NE(message.find("id -3 at position 1"), std::string::npos) << message;
  // The edges of the vocabulary decode (control pieces decode to nothing).
  EXPECT_NO_THROW(tokenizer->decode({0, vocab - 1}));
}

}  // namespace
}  // namespace tessera::data
