// The byte tokenizer: every byte string round-trips exactly; ids outside the vocabulary
// are rejected with their position.
#include <gtest/gtest.h>

#include <string>

#include "tessera/base/error.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {
namespace {

TEST(ByteTokenizer, RoundTripsEveryByte) {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "héllo, wörld \xF0\x9F\x98\x80\n";  // multi-byte UTF-8 becomes several tokens
  const auto tokenizer = make_tokenizer("byte");
  EXPECT_EQ(tokenizer->id(), "byte");
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  const std::vector<int32_t> ids = tokenizer->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i])) << i;
  EXPECT_EQ(tokenizer->decode(ids), text);
  EXPECT_TRUE(tokenizer->encode("").empty());
  EXPECT_EQ(tokenizer->decode({}), "");
}

TEST(ByteTokenizer, RejectsIdsOutsideTheVocabulary) {
  ByteTokenizer tokenizer;
  try {
    tokenizer.decode({104, 105, 256});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tokenizer.decode({-1}), ValueError);
}

// A spec that is neither a known kind nor an existing path names itself and lists
// the spellings that are accepted.
TEST(MakeTokenizer, UnknownSpecListsTheKnownForms) {
  try {
    make_tokenizer("gpt2-typo");
    FAIL() << "expected IOError (no such path)";
  } catch (const IOError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gpt2-typo"), std::string::npos) << what;
    EXPECT_NE(what.find("does not exist"), std::string::npos) << what;
    for (const char* form : {"'byte'", "'gpt2:PATH'", "'hf:PATH'", "'spm:PATH'"})
      EXPECT_NE(what.find(form), std::string::npos) << form << " missing from: " << what;
  }
  try {
    make_tokenizer("wordpiece:/tmp");
    FAIL() << "expected ValueError (unknown kind)";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown kind 'wordpiece'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::data
