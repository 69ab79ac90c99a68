// Hand-coded matchers for GPT-2's and Llama 3's pre-tokenizer regexes. A backtracking
// engine (Oniguruma, fancy-regex) tries the alternatives left to right at each position
// and takes the first that matches; the functions below do the same, alternative by
// alternative, on decoded UTF-8 characters.
#include "char_class.h"
#include "pretokenizer.h"

namespace tessera::data::bpe {

namespace {

using CC = CharClass;

// The end of the run of characters of class `cls` starting at s[i].
size_t run_end(const char* s, size_t n, size_t i, CC cls) {
  while (i < n) {
    const auto byte = static_cast<unsigned char>(s[i]);
    if (byte < 0x80) {
      if (detail::kAsciiClass[byte] != cls) break;
      ++i;
    } else {
      const Utf8Char c = detail::decode_non_ascii(s, n, i);
      if (c.cls != cls) break;
      i += c.length;
    }
  }
  return i;
}

bool is_cr_lf(char c) { return c == '\r' || c == '\n'; }

// \s+(?!\S)|\s+ at s[i] (a whitespace character): the whole whitespace run when it ends
// the text or is a single character, else the run without its last character (which is
// then followed by whitespace, so the lookahead holds).
size_t match_space_run(const char* s, size_t n, size_t i, size_t* last_cr_lf) {
  size_t last_start = i;
  size_t j = i;
  while (j < n) {
    const Utf8Char c = char_at(s, n, j);
    if (c.cls != CC::kSpace) break;
    if (last_cr_lf && is_cr_lf(s[j])) *last_cr_lf = j;
    last_start = j;
    j += c.length;
  }
  if (j == n || last_start == i) return j;
  return last_start;
}

// GPT-2's contractions: 's|'t|'re|'ve|'m|'ll|'d (case-sensitive); 0 when none matches.
size_t gpt2_contraction(const char* s, size_t n, size_t i) {
  if (i + 1 >= n) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 >= n) return 0;
  const char b = s[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d): Unicode case-insensitive, so 's also matches U+017F
// (LATIN SMALL LETTER LONG S, which case-folds to s); 0 when none matches.
size_t llama3_contraction(const char* s, size_t n, size_t i) {
  if (i + 1 >= n) return 0;
  const char a = static_cast<char>(s[i + 1] | 0x20);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 < n && s[i + 1] == '\xC5' && s[i + 2] == '\xBF') return i + 3;  // 'ſ
  if (i + 2 >= n) return 0;
  const char b = static_cast<char>(s[i + 2] | 0x20);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

}  // namespace

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const char* s, size_t n, size_t i) {
  if (s[i] == '\'') {
    if (const size_t end = gpt2_contraction(s, n, i)) return end;
  }
  if (s[i] == ' ' && i + 1 < n) {  // " ?" followed by a letter, number or other run
    const Utf8Char next = char_at(s, n, i + 1);
    if (next.cls != CC::kSpace) return run_end(s, n, i + 1 + next.length, next.cls);
  }
  const Utf8Char c = char_at(s, n, i);
  if (c.cls != CC::kSpace) return run_end(s, n, i + c.length, c.cls);
  return match_space_run(s, n, i, nullptr);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const char* s, size_t n, size_t i) {
  if (s[i] == '\'') {
    if (const size_t end = llama3_contraction(s, n, i)) return end;
  }
  const Utf8Char c = char_at(s, n, i);
  if (c.cls == CC::kLetter) return run_end(s, n, i + c.length, CC::kLetter);
  const size_t after = i + c.length;
  if (c.cls != CC::kNumber && !is_cr_lf(s[i]) && after < n) {  // [^\r\n\p{L}\p{N}]\p{L}+
    const Utf8Char next = char_at(s, n, after);
    if (next.cls == CC::kLetter) return run_end(s, n, after + next.length, CC::kLetter);
  }
  if (c.cls == CC::kNumber) {  // \p{N}{1,3}
    size_t j = after;
    for (int k = 1; k < 3 && j < n; ++k) {
      const Utf8Char d = char_at(s, n, j);
      if (d.cls != CC::kNumber) break;
      j += d.length;
    }
    return j;
  }
  size_t others = std::string::npos;  // where " ?[^\s\p{L}\p{N}]+" starts its run
  if (c.cls == CC::kOther) {
    others = i;
  } else if (s[i] == ' ' && after < n && char_at(s, n, after).cls == CC::kOther) {
    others = after;
  }
  if (others != std::string::npos) {
    size_t j = run_end(s, n, others, CC::kOther);
    while (j < n && is_cr_lf(s[j])) ++j;  // [\r\n]*
    return j;
  }
  // Whitespace. \s*[\r\n]+ ends after the run's last \r or \n (the greedy \s* backs off
  // to it); without one, \s+(?!\S)|\s+.
  size_t last_cr_lf = std::string::npos;
  const size_t end = match_space_run(s, n, i, &last_cr_lf);
  if (last_cr_lf != std::string::npos) return last_cr_lf + 1;
  return end;
}

// Why a cut at p is safe. Both patterns are matched left to right from each piece's
// end, have no lookbehind, and decide a match at position i from the characters up to
// one past its end. Take p with s[p-1] an ASCII letter or digit and s[p] ASCII whitespace:
// - GPT-2: a piece holds whitespace only (\s+...) or starts with at most one space and
//   has no whitespace after that; so no piece holds both s[p-1] and s[p], and p is a
//   piece boundary.
// - Llama 3: the pieces that hold a letter or digit end with a letter or digit run
//   (contractions, [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,3}) and never take whitespace after
//   it ([\r\n]* follows only the "other" run); so p is a piece boundary.
// Then the pieces from p depend on text[p:] alone, and the pieces before p are the same
// in text[:p]: each of them, and each alternative that failed before it, was decided by
// characters before p or by s[p-1]'s class ending a run, which the end of text[:p] ends too.
size_t next_safe_cut(KnownPattern which, std::string_view text, size_t from) {
  if (which == KnownPattern::kNone) return std::string::npos;
  for (size_t p = from < 1 ? 1 : from; p < text.size(); ++p)
    if (is_ascii_space(text[p]) && is_ascii_alnum(text[p - 1])) return p;
  return std::string::npos;
}

namespace {

class HandCodedSplit final : public SplitPattern {
 public:
  explicit HandCodedSplit(KnownPattern which)
      : which_(which), pattern_(which == KnownPattern::kGpt2 ? kGpt2Pattern : kLlama3Pattern) {}
  void split(std::string_view text, std::vector<std::string_view>& pieces) const override {
    const char* s = text.data();
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
      const size_t end = which_ == KnownPattern::kGpt2 ? match_gpt2(s, n, i) : match_llama3(s, n, i);
      pieces.emplace_back(s + i, end - i);
      i = end;
    }
  }
  KnownPattern known() const override { return which_; }
  const std::string& pattern() const override { return pattern_; }

 private:
  KnownPattern which_;
  std::string pattern_;
};

}  // namespace

std::shared_ptr<const SplitPattern> make_hand_coded_split(KnownPattern which) {
  return std::make_shared<HandCodedSplit>(which);
}

std::shared_ptr<const SplitPattern> make_split_pattern(const std::string& regex, const std::string& where) {
  if (regex == kGpt2Pattern) return make_hand_coded_split(KnownPattern::kGpt2);
  if (regex == kLlama3Pattern || regex == kCl100kPattern) return make_hand_coded_split(KnownPattern::kLlama3);
  return make_icu_split(regex, where);
}

}  // namespace tessera::data::bpe
