#include "byte_level.h"

#include <array>

#include "char_class.h"

namespace tessera::data::bpe {

namespace {

// bytes_to_unicode(): bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF keep their code point;
// the remaining 68 bytes, in increasing order, get U+0100, U+0101, ...
struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // indexed by code point (all < 0x144), -1 when unused
  Alphabet() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet table;
  return table;
}

void append_utf8(std::string& out, char32_t code) {
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else {  // the alphabet stays below U+0800: two bytes
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

}  // namespace

char32_t byte_to_char(unsigned char byte) { return alphabet().to_char[byte]; }

std::optional<std::string> byte_level_decode(std::string_view token) {
  const Alphabet& table = alphabet();
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const Utf8Char c = char_at(token.data(), token.size(), i);
    if (c.code == 0xFFFD || c.code >= table.to_byte.size() || table.to_byte[c.code] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(table.to_byte[c.code]));
    i += c.length;
  }
  return bytes;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string token;
  token.reserve(bytes.size() * 2);
  for (const char b : bytes) append_utf8(token, byte_to_char(static_cast<unsigned char>(b)));
  return token;
}

}  // namespace tessera::data::bpe
