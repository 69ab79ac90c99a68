// Hugging Face tokenizer.json with a byte-level BPE model: GPT-2 style (ByteLevel
// pre-tokenizer with use_regex) or Llama 3 style (Split regex + ByteLevel without it).
// What is read: added_tokens, normalizer (null only), pre_tokenizer (ByteLevel, Split,
// Sequence of those), decoder (ByteLevel or null), model (BPE: vocab, merges as "a b"
// strings or [a, b] pairs, ignore_merges). post_processor is ignored: encode adds no
// BOS/EOS. Anything else that would change the ids is an IOError naming the key.
#include <filesystem>
#include <optional>

#include "bpe_tokenizer.h"
#include "json_file.h"
#include "tessera/base/error.h"
#include "tessera/base/json_field.h"
#include "tessera/data/bpe_tokenizer.h"

namespace tessera::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class TokenizerJson {
 public:
  explicit TokenizerJson(fs::path file) : file_(std::move(file)), root_(bpe::read_json_file(file_)) {
    if (!root_.is_object()) fail<IOError>("{}: expected a JSON object (got a {})", name(), root_.type_name());
  }

  std::unique_ptr<Tokenizer> load() {
    check_normalizer();
    check_decoder();
    bpe::BpeTokenizerParts parts;
    parts.model = read_model();
    if (root_.contains("pre_tokenizer") && !root_["pre_tokenizer"].is_null())
      read_pre_tokenizer(root_["pre_tokenizer"], "pre_tokenizer", parts.pre_tokenizer);
    if (!byte_level_seen_)
      fail<IOError>("{}: key 'pre_tokenizer': no ByteLevel pre-tokenizer (only byte-level BPE is supported)", name());
    parts.added_tokens = read_added_tokens();
    parts.spec = "hf:" + file_.string();
    return bpe::make_bpe_tokenizer(std::move(parts));
  }

 private:
  std::string name() const { return file_.string(); }

  // The string value of `object[key]`, or "" when it is missing or null.
  std::string string_of(const json& object, const std::string& key, const std::string& path) const {
    if (!object.contains(key) || object[key].is_null()) return "";
    if (!object[key].is_string())
      fail<IOError>("{}: key '{}.{}': expected a string (got {})", name(), path, key, object[key].dump());
    return object[key].get<std::string>();
  }
  bool bool_of(const json& object, const std::string& key, const std::string& path, bool fallback) const {
    if (!object.contains(key) || object[key].is_null()) return fallback;
    if (!object[key].is_boolean())
      fail<IOError>("{}: key '{}.{}': expected true or false (got {})", name(), path, key, object[key].dump());
    return object[key].get<bool>();
  }
  std::string type_of(const json& object, const std::string& path) const {
    if (!object.is_object()) fail<IOError>("{}: key '{}': expected an object (got {})", name(), path, object.dump());
    return string_of(object, "type", path);
  }

  void check_normalizer() const {
    if (!root_.contains("normalizer") || root_["normalizer"].is_null()) return;
    const json& n = root_["normalizer"];
    const std::string type = type_of(n, "normalizer");
    if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() && n["normalizers"].empty())
      return;
    fail<IOError>(
        "{}: key 'normalizer': type '{}' is not supported (expected null: byte-level BPE without a normalizer)", name(),
        type);
  }

  void check_decoder() const {
    if (!root_.contains("decoder") || root_["decoder"].is_null()) return;
    const std::string type = type_of(root_["decoder"], "decoder");
    if (type != "ByteLevel")
      fail<IOError>("{}: key 'decoder': type '{}' is not supported (expected 'ByteLevel' or null)", name(), type);
  }

  std::unique_ptr<bpe::BpeModel> read_model() const {
    if (!root_.contains("model")) fail<IOError>("{}: key 'model' is missing (expected the BPE model)", name());
    const json& model = root_["model"];
    const std::string type = type_of(model, "model");
    if (!type.empty() && type != "BPE")
      fail<IOError>("{}: key 'model.type': model type '{}' is not supported (only 'BPE')", name(), type);
    if (model.contains("dropout") && !model["dropout"].is_null())
      fail<IOError>("{}: key 'model.dropout' is {} (BPE dropout is not supported: expected null)", name(),
                    model["dropout"].dump());
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (!string_of(model, key, "model").empty())
        fail<IOError>("{}: key 'model.{}' is '{}' (not supported for byte-level BPE: expected null or \"\")", name(),
                      key, string_of(model, key, "model"));
    if (!model.contains("vocab") || !model["vocab"].is_object())
      fail<IOError>("{}: key 'model.vocab' is missing or not an object (expected token -> id)", name());
    std::vector<std::pair<std::string, int64_t>> vocab;
    for (const auto& [token, id] : model["vocab"].items()) {
      if (!id.is_number_integer())
        fail<IOError>("{}: key 'model.vocab' entry '{}': expected an integer id (got {})", name(), token, id.dump());
      vocab.emplace_back(token, id.get<int64_t>());
    }
    if (!model.contains("merges") || !model["merges"].is_array())
      fail<IOError>("{}: key 'model.merges' is missing or not an array", name());
    std::vector<std::pair<std::string, std::string>> merges;
    for (size_t i = 0; i < model["merges"].size(); ++i) {
      const json& m = model["merges"][i];
      if (m.is_string()) {  // older files: "left right"
        const std::string text = m.get<std::string>();
        const size_t space = text.find(' ');
        if (space != std::string::npos && space > 0 && space + 1 < text.size() &&
            text.find(' ', space + 1) == std::string::npos) {
          merges.emplace_back(text.substr(0, space), text.substr(space + 1));
          continue;
        }
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
        continue;
      }
      fail<IOError>(
          "{}: key 'model.merges[{}]': {} is not a merge of two tokens (expected \"left right\" or "
          "[\"left\", \"right\"])",
          name(), i, m.dump());
    }
    return std::make_unique<bpe::BpeModel>(
        vocab, [&](const std::string& token) { return fmt::format("{}: key 'model.vocab' entry '{}'", name(), token); },
        merges, [&](size_t i) { return fmt::format("{}: key 'model.merges[{}]'", name(), i); },
        bool_of(model, "ignore_merges", "model", false));
  }

  void read_pre_tokenizer(const json& p, const std::string& path, std::vector<bpe::PreTokenizerStep>& steps) {
    const std::string type = type_of(p, path);
    if (type == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
        fail<IOError>("{}: key '{}.pretokenizers' is missing or not an array", name(), path);
      for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
        read_pre_tokenizer(p["pretokenizers"][i], fmt::format("{}.pretokenizers[{}]", path, i), steps);
    } else if (type == "ByteLevel") {
      if (byte_level_seen_) fail<IOError>("{}: key '{}': a second ByteLevel pre-tokenizer", name(), path);
      byte_level_seen_ = true;
      if (bool_of(p, "add_prefix_space", path, true)) steps.push_back({true, nullptr});
      if (bool_of(p, "use_regex", path, true))
        steps.push_back({false, bpe::make_hand_coded_split(bpe::KnownPattern::kGpt2)});
    } else if (type == "Split") {
      if (byte_level_seen_)
        fail<IOError>("{}: key '{}': a Split after the ByteLevel pre-tokenizer is not supported", name(), path);
      const std::string behavior = string_of(p, "behavior", path);
      if (behavior != "Isolated")
        fail<IOError>("{}: key '{}.behavior' is '{}' (only 'Isolated' is supported)", name(), path, behavior);
      if (bool_of(p, "invert", path, false)) fail<IOError>("{}: key '{}.invert' must be false", name(), path);
      const json& pattern = p.contains("pattern") ? p["pattern"] : json();
      const std::string where = fmt::format("{}: key '{}.pattern'", name(), path);
      if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        steps.push_back({false, bpe::make_split_pattern(pattern["Regex"].get<std::string>(), where)});
      } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
        steps.push_back({false, bpe::make_icu_split("\\Q" + pattern["String"].get<std::string>() + "\\E", where)});
      } else {
        fail<IOError>("{}: expected {{\"Regex\": ...}} or {{\"String\": ...}} (got {})", where, pattern.dump());
      }
    } else {
      fail<IOError>("{}: key '{}': pre-tokenizer type '{}' is not supported (ByteLevel, Split, Sequence)", name(), path,
                    type);
    }
  }

  std::vector<bpe::AddedToken> read_added_tokens() const {
    std::vector<bpe::AddedToken> tokens;
    if (!root_.contains("added_tokens") || root_["added_tokens"].is_null()) return tokens;
    const json& list = root_["added_tokens"];
    if (!list.is_array()) fail<IOError>("{}: key 'added_tokens': expected an array", name());
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string path = fmt::format("added_tokens[{}]", i);
      const json& t = list[i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          !t.contains("content") || !t["content"].is_string() || t["content"].get<std::string>().empty())
        fail<IOError>("{}: key '{}': expected {{\"id\": non-negative integer, \"content\": non-empty string, ...}}",
                      name(), path);
      // An id that does not fit int32 would be narrowed (2^32 becoming token 0).
      const std::optional<int32_t> id = json_field<int32_t>(t, "id");
      if (!id || *id == INT32_MAX)
        fail<IOError>("{}: key '{}.id': {} is outside [0, 2^31 - 1)", name(), path, t["id"].dump());
      if (bool_of(t, "single_word", path, false))
        fail<IOError>("{}: key '{}.single_word' is true (not supported)", name(), path);
      tokens.push_back({t["content"].get<std::string>(), *id, bool_of(t, "lstrip", path, false),
                        bool_of(t, "rstrip", path, false), bool_of(t, "special", path, false)});
    }
    return tokens;
  }

  fs::path file_;
  json root_;
  bool byte_level_seen_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const fs::path& path) {
  return TokenizerJson(fs::absolute(path).lexically_normal()).load();
}

}  // namespace tessera::data
