#include "json_file.h"

#include <fstream>
#include <iterator>

#include "tessera/base/error.h"

namespace tessera::data::bpe {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IOError>("{}: cannot open for reading", path.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail<IOError>("{}: read failed", path.string());
  return text;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number past double's range ("1e999") is an out_of_range.
    fail<IOError>("{}: invalid JSON: {}", path.string(), e.what());
  }
}

}  // namespace tessera::data::bpe
