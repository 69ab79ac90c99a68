// Internal: the data.mixture key of a training config (config.cpp).
#pragma once

#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/data/pipeline_spec.h"

namespace tessera::train::detail {

// A ConfigError naming `where` and the entry for anything but a list of tables with a
// string path, an optional name/kind/documents (string; documents may be a token id)
// and a numeric weight.
std::vector<data::SourceSpec> read_mixture(const toml::node& node, const std::string& where);
nlohmann::json mixture_json(const std::vector<data::SourceSpec>& sources);
// A JSON value as TOML inline syntax (objects as inline tables): how a checkpoint's
// config re-enters the config reader.
std::string toml_inline(const nlohmann::json& value);

}  // namespace tessera::train::detail
