// GPT-2's byte <-> unicode alphabet: each of the 256 bytes is shown as one printable
// character (printable Latin-1 bytes as themselves, the others as U+0100 upwards), so
// vocabulary files hold byte strings as readable text ("Ġthe" is " the").
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tessera::data::bpe {

// The code point that stands for `byte`.
char32_t byte_to_char(unsigned char byte);

// The bytes a vocabulary token written in the alphabet stands for; nullopt when the
// token holds a character outside the alphabet (or is not valid UTF-8).
std::optional<std::string> byte_level_decode(std::string_view token);

// The token text (UTF-8, in the alphabet) for raw bytes.
std::string byte_level_encode(std::string_view bytes);

}  // namespace tessera::data::bpe
