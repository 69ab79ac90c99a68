// The hand-coded GPT-2 and Llama 3 pre-tokenizer matchers against ICU's regex engine
// running the same patterns (the fallback for other tokenizer.json regexes), on the
// golden texts and on random mixes of the characters where the patterns differ.
#include <gtest/gtest.h>

#include <random>

#include "bpe_test_util.h"
#include "data/tokenizers/pretokenizer.h"
#include "tessera/base/error.h"

namespace tessera::data::bpe {
namespace {

std::vector<std::string_view> split(const SplitPattern& pattern, std::string_view text) {
  std::vector<std::string_view> pieces;
  pattern.split(text, pieces);
  return pieces;
}

std::string random_text(std::mt19937& gen, size_t units) {
  static const char* kUnits[] = {"a",        "Z",         "é",        "ж",
                                 "中",       "ـ",         "1",        "٣",
                                 "²",        "Ⅷ",         " ",        "  ",
                                 "\t",       "\n",        "\r\n",     "\r",
                                 "\v",       "\xC2\x85",  "\xC2\xA0", "\xE3\x80\x80",
                                 "'",        "'s",        "'S",       "'re",
                                 "'LL",      "'\xC5\xBF", "!",        "?!",
                                 "...",      "😀",         "👍🏽", "\xE2\x80\x8D",
                                 "\xCC\x81", "_",         "$"};
  std::string text;
  for (size_t i = 0; i < units; ++i) text += kUnits[gen() % std::size(kUnits)];
  return text;
}

TEST(PreTokenizer, HandCodedMatchersAgreeWithIcu) {
  for (const auto& [known, regex] :
       {std::pair{KnownPattern::kGpt2, kGpt2Pattern}, std::pair{KnownPattern::kLlama3, kLlama3Pattern}}) {
    const auto hand = make_hand_coded_split(known);
    const auto icu = make_icu_split(std::string(regex), "test");
    for (const std::string& text : testing::bpe_golden().texts)
      EXPECT_EQ(split(*hand, text), split(*icu, text)) << regex << " on '" << text << "'";
    std::mt19937 gen(3);
    for (int trial = 0; trial < 300; ++trial) {
      const std::string text = random_text(gen, 1 + gen() % 40);
      EXPECT_EQ(split(*hand, text), split(*icu, text)) << regex << " on '" << text << "'";
    }
  }
}

TEST(PreTokenizer, KnownPatternsAreRecognised) {
  EXPECT_EQ(make_split_pattern(std::string(kGpt2Pattern), "t")->known(), KnownPattern::kGpt2);
  EXPECT_EQ(make_split_pattern(std::string(kLlama3Pattern), "t")->known(), KnownPattern::kLlama3);
  EXPECT_EQ(make_split_pattern(std::string(kCl100kPattern), "t")->known(), KnownPattern::kLlama3);
  const auto other = make_split_pattern(R"(\p{N}|[^\p{N}]+)", "t");
  EXPECT_EQ(other->known(), KnownPattern::kNone);
  const std::vector<std::string_view> expected{"ab", "1", "2", " c"};
  EXPECT_EQ(split(*other, "ab12 c"), expected);
}

TEST(PreTokenizer, SafeCutsSplitIntoTheSamePieces) {
  std::mt19937 gen(5);
  for (const KnownPattern known : {KnownPattern::kGpt2, KnownPattern::kLlama3}) {
    const auto pattern = make_hand_coded_split(known);
    for (int trial = 0; trial < 200; ++trial) {
      const std::string text = random_text(gen, 60);
      const auto whole = split(*pattern, text);
      for (size_t cut = next_safe_cut(known, text, 1); cut != std::string::npos;
           cut = next_safe_cut(known, text, cut + 1)) {
        auto pieces = split(*pattern, std::string_view(text).substr(0, cut));
        const auto rest = split(*pattern, std::string_view(text).substr(cut));
        pieces.insert(pieces.end(), rest.begin(), rest.end());
        EXPECT_EQ(pieces, whole) << "cut at " << cut << " of '" << text << "'";
      }
    }
  }
}

TEST(PreTokenizer, BadRegexIsAnIOError) {
  try {
    make_split_pattern("(unclosed", "tokenizer.json: key 'pre_tokenizer.pattern'");
    FAIL() << "expected IOError";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer.pattern"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::data::bpe
