// GPT-2's own files: vocab.json (token -> id, tokens in the byte-level alphabet) and
// merges.txt ("#version" line, then one "left right" merge per line, in rank order),
// or the same under OpenAI's names encoder.json and vocab.bpe.
#include <filesystem>
#include <sstream>

#include "bpe_tokenizer.h"
#include "json_file.h"
#include "tessera/base/error.h"
#include "tessera/data/bpe_tokenizer.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

struct Gpt2Paths {
  fs::path vocab, merges;
};

Gpt2Paths find_files(const fs::path& path) {
  if (fs::is_directory(path)) {
    if (fs::exists(path / "vocab.json") && fs::exists(path / "merges.txt"))
      return {path / "vocab.json", path / "merges.txt"};
    if (fs::exists(path / "encoder.json") && fs::exists(path / "vocab.bpe"))
      return {path / "encoder.json", path / "vocab.bpe"};
    fail<IOError>("{}: no GPT-2 BPE files (expected vocab.json + merges.txt or encoder.json + vocab.bpe)",
                  path.string());
  }
  const fs::path merges = path.parent_path() / (path.filename() == "encoder.json" ? "vocab.bpe" : "merges.txt");
  if (!fs::exists(merges))
    fail<IOError>("{}: the merges file {} next to it does not exist", path.string(), merges.string());
  return {path, merges};
}

std::vector<std::pair<std::string, int64_t>> read_vocab(const fs::path& file) {
  const nlohmann::json json = bpe::read_json_file(file);
  if (!json.is_object())
    fail<IOError>("{}: expected a JSON object of token -> id (got a {})", file.string(), json.type_name());
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(json.size());
  for (const auto& [token, id] : json.items()) {
    if (!id.is_number_integer())
      fail<IOError>("{}: key '{}': expected an integer id (got {})", file.string(), token, id.dump());
    vocab.emplace_back(token, id.get<int64_t>());
  }
  return vocab;
}

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_bpe(const fs::path& path) {
  const fs::path absolute = fs::absolute(path).lexically_normal();
  const Gpt2Paths files = find_files(absolute);
  const auto vocab = read_vocab(files.vocab);

  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<size_t> merge_lines;
  std::istringstream text(bpe::read_text_file(files.merges));
  std::string line;
  std::vector<size_t> blank_lines;
  for (size_t number = 1; std::getline(text, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (number == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) {  // allowed at the end of the file only
      blank_lines.push_back(number);
      continue;
    }
    if (!blank_lines.empty())
      fail<IOError>("{}:{}: empty line inside the merges (expected 'left right')", files.merges.string(),
                    blank_lines.front());
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      fail<IOError>("{}:{}: '{}' is not a merge of two tokens (expected 'left right')", files.merges.string(), number,
                    line);
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    merge_lines.push_back(number);
  }

  bpe::BpeTokenizerParts parts;
  parts.model = std::make_unique<bpe::BpeModel>(
      vocab, [&](const std::string& token) { return fmt::format("{}: key '{}'", files.vocab.string(), token); }, merges,
      [&](size_t rank) { return fmt::format("{}:{}", files.merges.string(), merge_lines[rank]); },
      /*ignore_merges=*/false);
  parts.pre_tokenizer = {{false, bpe::make_hand_coded_split(bpe::KnownPattern::kGpt2)}};
  for (const auto& [token, id] : vocab)
    if (token == "<|endoftext|>") parts.added_tokens.push_back({token, static_cast<int32_t>(id)});
  parts.spec = "gpt2:" + absolute.string();
  return bpe::make_bpe_tokenizer(std::move(parts));
}

}  // namespace tessera::data
