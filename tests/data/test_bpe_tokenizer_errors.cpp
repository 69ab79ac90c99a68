// Malformed BPE tokenizer files: each IOError names the file and the line or key.
#include <gtest/gtest.h>

#include "bpe_test_util.h"
#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/bpe_tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::bpe_fixtures;

// Runs `load` and checks it throws an IOError whose message holds every one of `parts`.
template <typename Load>
void expect_io_error(Load load, const std::vector<std::string>& parts) {
  try {
    load();
    ADD_FAILURE() << "expected IOError with " << parts.front();
  } catch (const IOError& e) {
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

class Gpt2FileErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy(bpe_fixtures() / "gpt2_style/vocab.json", dir_ / "vocab.json");
    fs::copy(bpe_fixtures() / "gpt2_style/merges.txt", dir_ / "merges.txt");
  }
  fs::path file(const std::string& name) const { return dir_ / name; }
  void load() const { load_gpt2_bpe(dir_.path()); }
  testing::TempDir dir_;
};

TEST_F(Gpt2FileErrors, MergeLineThatIsNotTwoTokens) {
  testing::write_bytes(file("merges.txt"), "#version: 0.2\nĠ t\nh e x\n");
  expect_io_error([&] { load(); }, {"merges.txt:3", "h e x"});
}

TEST_F(Gpt2FileErrors, MergeOfTokensNotInTheVocabulary) {
  testing::write_bytes(file("merges.txt"), "#version: 0.2\nĠ t\nq Ġz\n");
  expect_io_error([&] { load(); }, {"merges.txt:3", "merge 'q Ġz'", "is not in the vocabulary"});
}

TEST_F(Gpt2FileErrors, VocabNotAnObjectOfIds) {
  testing::write_bytes(file("vocab.json"), "[1, 2]");
  expect_io_error([&] { load(); }, {"vocab.json", "object"});
  testing::write_bytes(file("vocab.json"), R"({"a": 1, "b": "two"})");
  expect_io_error([&] { load(); }, {"vocab.json", "key 'b'", "integer"});
}

TEST_F(Gpt2FileErrors, DuplicateIds) {
  json vocab = json::parse(testing::read_bytes(file("vocab.json")));
  vocab["zzzz"] = 5;
  testing::write_bytes(file("vocab.json"), vocab.dump());
  expect_io_error([&] { load(); }, {"vocab.json", "id 5", "zzzz"});
}

// One id far past the others would size the id tables by it (2^31 ids: gigabytes).
TEST_F(Gpt2FileErrors, IdFarPastTheVocabulary) {
  json vocab = json::parse(testing::read_bytes(file("vocab.json")));
  vocab["zzzz"] = 2147483000;
  testing::write_bytes(file("vocab.json"), vocab.dump());
  expect_io_error([&] { load(); }, {"vocab.json", "zzzz", "id 2147483000", "dense"});
}

TEST_F(Gpt2FileErrors, InvalidJson) {
  testing::write_bytes(file("vocab.json"), R"({"a": 1,)");
  expect_io_error([&] { load(); }, {"vocab.json", "invalid JSON", "parse error"});
}

// A number past double's range is the JSON library's out_of_range, not a parse_error
// (found by fuzz_gpt2_bpe and fuzz_tokenizer_json): an IOError all the same.
TEST_F(Gpt2FileErrors, NumberOverflowIsInvalidJson) {
  testing::write_bytes(file("vocab.json"), R"({"a": 1e999})");
  expect_io_error([&] { load(); }, {"vocab.json: invalid JSON", "number overflow parsing '1e999'"});
}

TEST_F(Gpt2FileErrors, MissingByteToken) {
  json vocab = json::parse(testing::read_bytes(file("vocab.json")));
  vocab.erase("!");
  testing::write_bytes(file("vocab.json"), vocab.dump());
  testing::write_bytes(file("merges.txt"), "#version: 0.2\n");
  expect_io_error([&] { load(); }, {"vocab.json", "byte 0x21"});
}

class TokenizerJsonErrors : public ::testing::Test {
 protected:
  void SetUp() override { json_ = json::parse(testing::read_bytes(bpe_fixtures() / "llama3_style/tokenizer.json")); }
  void expect_error(const std::vector<std::string>& parts) {
    testing::write_bytes(dir_ / "tokenizer.json", json_.dump());
    std::vector<std::string> all{"tokenizer.json"};
    all.insert(all.end(), parts.begin(), parts.end());
    expect_io_error([&] { load_tokenizer_json(dir_ / "tokenizer.json"); }, all);
  }
  testing::TempDir dir_;
  json json_;
};

TEST_F(TokenizerJsonErrors, MissingVocab) {
  json_["model"].erase("vocab");
  expect_error({"model.vocab"});
}

TEST_F(TokenizerJsonErrors, UnsupportedModels) {
  for (const char* type : {"WordPiece", "Unigram"}) {
    json_["model"]["type"] = type;
    expect_error({"model.type", type});
  }
}

TEST_F(TokenizerJsonErrors, UnsupportedPreTokenizerNormalizerDecoder) {
  json_["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
  expect_error({"pre_tokenizer.pretokenizers[0]", "Whitespace"});
  SetUp();
  json_["normalizer"] = {{"type", "NFKC"}};
  expect_error({"normalizer", "NFKC"});
  SetUp();
  json_["decoder"] = {{"type", "WordPiece"}};
  expect_error({"decoder", "WordPiece"});
}

TEST_F(TokenizerJsonErrors, UnsupportedModelOptions) {
  json_["model"]["dropout"] = 0.1;
  expect_error({"model.dropout"});
  SetUp();
  json_["model"]["continuing_subword_prefix"] = "##";
  expect_error({"model.continuing_subword_prefix"});
  SetUp();
  json_["model"]["end_of_word_suffix"] = "</w>";
  expect_error({"model.end_of_word_suffix"});
}

TEST_F(TokenizerJsonErrors, BadMergeAndAddedToken) {
  json_["model"]["merges"][7] = json::array({"Ġ", "nonexistent"});
  expect_error({"model.merges[7]", "nonexistent"});
  SetUp();
  json_["added_tokens"][1]["single_word"] = true;
  expect_error({"added_tokens[1].single_word"});
}

// An added token's id must fit int32 (2^32 would be narrowed to token 0) and sit near the
// vocabulary (2^31 - 1000 would size the tables by it).
TEST_F(TokenizerJsonErrors, AddedTokenIdsThatDoNotFit) {
  json_["added_tokens"][1]["id"] = uint64_t{1} << 32;
  expect_error({"added_tokens[1].id", "4294967296", "outside"});
  SetUp();
  json_["added_tokens"][1]["id"] = 2147483000;
  expect_error({"added token", "2147483000", "dense"});
}

TEST_F(TokenizerJsonErrors, InvalidJson) {
  testing::write_bytes(dir_ / "tokenizer.json", "{\"model\": ");
  expect_io_error([&] { load_tokenizer_json(dir_ / "tokenizer.json"); }, {"tokenizer.json", "invalid JSON"});
  testing::write_bytes(dir_ / "tokenizer.json", R"({"model": {"vocab": {"a": -88e888}}})");
  expect_io_error([&] { load_tokenizer_json(dir_ / "tokenizer.json"); },
                  {"tokenizer.json: invalid JSON", "number overflow parsing '-88e888'"});
}

}  // namespace
}  // namespace tessera::data
