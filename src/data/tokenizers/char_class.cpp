#include "char_class.h"

#include <unicode/uchar.h>

namespace tessera::data::bpe {

CharClass classify_non_ascii(char32_t code) {
  const auto c = static_cast<UChar32>(code);
  if (u_isUWhiteSpace(c)) return CharClass::kSpace;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

namespace detail {

// Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF); a byte that does not
// start a valid sequence is one "other" character of length 1, so every byte of the
// input lands in exactly one piece and decoding stays exact.
Utf8Char decode_non_ascii(const char* s, size_t n, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) -> int {
    if (i + k >= n) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    return (b & 0xC0) == 0x80 ? (b & 0x3F) : -1;
  };
  char32_t code = 0;
  uint8_t length = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    const int c1 = cont(1);
    if (c1 >= 0) code = ((b0 & 0x1Fu) << 6) | static_cast<char32_t>(c1), length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    const int c1 = cont(1), c2 = cont(2);
    if (c1 >= 0 && c2 >= 0) {
      code = ((b0 & 0x0Fu) << 12) | (static_cast<char32_t>(c1) << 6) | static_cast<char32_t>(c2);
      if (code >= 0x800 && (code < 0xD800 || code > 0xDFFF)) length = 3;
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    const int c1 = cont(1), c2 = cont(2), c3 = cont(3);
    if (c1 >= 0 && c2 >= 0 && c3 >= 0) {
      code = ((b0 & 0x07u) << 18) | (static_cast<char32_t>(c1) << 12) | (static_cast<char32_t>(c2) << 6) |
             static_cast<char32_t>(c3);
      if (code >= 0x10000 && code <= 0x10FFFF) length = 4;
    }
  }
  if (length == 0) return {0xFFFD, 1, CharClass::kOther};
  return {code, length, classify_non_ascii(code)};
}

}  // namespace detail
}  // namespace tessera::data::bpe
