// Reading the JSON files of tokenizers: parse errors and wrong shapes are IOErrors that
// name the file (and the key).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::data::bpe {

// The parsed file; an IOError with the parser's message and the file name otherwise.
nlohmann::json read_json_file(const std::filesystem::path& path);

// The text of a file; an IOError naming it when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace tessera::data::bpe
