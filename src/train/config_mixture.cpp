// data.mixture: a list of sources, written as TOML arrays of tables ([[data.mixture]])
// or inline tables (--set 'data.mixture=[{path = "a.bin", weight = 2}]').
#include "train/config_mixture.h"

#include <fmt/format.h>

#include <sstream>

#include "tessera/base/error.h"

namespace tessera::train::detail {
namespace {

std::string type_of(const toml::node& node) {
  std::ostringstream s;
  s << node.type();
  return s.str();
}

std::string read_string(const toml::node& node, const std::string& where, const std::string& key) {
  if (auto v = node.value_exact<std::string>()) return *v;
  fail<ConfigError>("{}: '{}' expects a string (got a {})", where, key, type_of(node));
}

}  // namespace

std::vector<data::SourceSpec> read_mixture(const toml::node& node, const std::string& where) {
  const toml::array* array = node.as_array();
  if (!array)
    fail<ConfigError>("{}: 'data.mixture' expects a list of sources ([[data.mixture]] tables; got a {})", where,
                      type_of(node));
  std::vector<data::SourceSpec> sources;
  for (size_t i = 0; i < array->size(); ++i) {
    const toml::table* table = (*array)[i].as_table();
    const std::string at = fmt::format("{}: data.mixture[{}]", where, i);
    if (!table) fail<ConfigError>("{} expects a table with path and weight (got a {})", at, type_of((*array)[i]));
    data::SourceSpec spec;
    for (auto&& [key_name, value] : *table) {
      const std::string key(key_name.str());
      if (key == "name") {
        spec.name = read_string(value, at, key);
      } else if (key == "path") {
        spec.path = read_string(value, at, key);
      } else if (key == "kind") {
        spec.kind = read_string(value, at, key);
      } else if (key == "documents") {
        if (auto id = value.value_exact<int64_t>())
          spec.documents = std::to_string(*id);
        else
          spec.documents = read_string(value, at, key);
      } else if (key == "weight") {
        if (auto w = value.value_exact<double>())
          spec.weight = *w;
        else if (auto n = value.value_exact<int64_t>())
          spec.weight = static_cast<double>(*n);
        else
          fail<ConfigError>("{}: 'weight' expects a number (got a {})", at, type_of(value));
      } else {
        fail<ConfigError>("{}: unknown key '{}' (a source has name, path, weight, kind, documents)", at, key);
      }
    }
    sources.push_back(std::move(spec));
  }
  return sources;
}

nlohmann::json mixture_json(const std::vector<data::SourceSpec>& sources) {
  nlohmann::json out = nlohmann::json::array();
  for (const data::SourceSpec& s : sources)
    out.push_back(
        {{"name", s.name}, {"path", s.path}, {"weight", s.weight}, {"kind", s.kind}, {"documents", s.documents}});
  return out;
}

std::string toml_inline(const nlohmann::json& value) {
  if (value.is_object()) {
    std::string text = "{";
    for (const auto& [key, item] : value.items())
      text += fmt::format("{}{} = {}", text.size() > 1 ? ", " : "", nlohmann::json(key).dump(), toml_inline(item));
    return text + "}";
  }
  if (value.is_array()) {
    std::string text = "[";
    for (const nlohmann::json& item : value) text += (text.size() > 1 ? ", " : "") + toml_inline(item);
    return text + "]";
  }
  return value.dump();  // strings (JSON escapes are TOML basic-string escapes), numbers, booleans
}

}  // namespace tessera::train::detail
