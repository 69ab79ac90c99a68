// The character classes the pre-tokenizer regexes use (\p{L}, \p{N}, \s), read from
// UTF-8 one code point at a time. \s is Unicode's White_Space property, as in the
// Rust regex crate (tiktoken, fancy-regex) and Oniguruma (Hugging Face tokenizers);
// \p{L} and \p{N} are the general categories L* and N* from ICU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tessera::data::bpe {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

struct Utf8Char {
  char32_t code;   // the code point (0xFFFD for a byte that starts no valid UTF-8 sequence)
  uint8_t length;  // its bytes (1 for an invalid byte: each one is its own "other" character)
  CharClass cls;
};

// The class of a non-ASCII code point (ICU lookups).
CharClass classify_non_ascii(char32_t code);

namespace detail {
constexpr std::array<CharClass, 128> ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    if (c == ' ' || (c >= '\t' && c <= '\r'))
      classes[c] = CharClass::kSpace;
    else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      classes[c] = CharClass::kLetter;
    else if (c >= '0' && c <= '9')
      classes[c] = CharClass::kNumber;
    else
      classes[c] = CharClass::kOther;
  }
  return classes;
}
inline constexpr std::array<CharClass, 128> kAsciiClass = ascii_classes();
Utf8Char decode_non_ascii(const char* s, size_t n, size_t i);
}  // namespace detail

// The character starting at s[i] (i < n).
inline Utf8Char char_at(const char* s, size_t n, size_t i) {
  const auto byte = static_cast<unsigned char>(s[i]);
  if (byte < 0x80) return {byte, 1, detail::kAsciiClass[byte]};
  return detail::decode_non_ascii(s, n, i);
}

inline bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
inline bool is_ascii_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace tessera::data::bpe
