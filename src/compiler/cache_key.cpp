// Compilation cache keys: everything that decides what an Executable computes (the
// traced graph's text and constants, remat regions, donation, compile options and
// disabled passes, device, compiler and format versions), hashed into a fingerprint.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "compiler/cache_format.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/version.h"
#include "tessera/compiler/compilation_cache.h"

namespace tessera::compiler {

using namespace cache_format;

namespace {

// The constants' bytes in the order Graph::text() prints them (first read, then
// returned directly), so equal programs hash equal whatever their value ids.
std::string constants_digest(const Graph& g) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  std::set<ValueId> seen;
  auto add = [&](ValueId v) {
    if (g.value(v).kind != ValueKind::Constant || !seen.insert(v).second) return;
    const Array& c = g.value(v).constant;
    const uint64_t n = c.nbytes();
    XXH3_128bits_update(state, &n, sizeof(n));
    XXH3_128bits_update(state, c.raw_data(), c.nbytes());
  };
  for (const Node& node : g.nodes) {
    if (node.dead) continue;
    for (ValueId in : node.inputs) add(in);
  }
  for (ValueId out : g.outputs) add(out);
  std::string digest = hex128(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return digest;
}

}  // namespace

// ---- the key ----

std::vector<std::pair<std::string, std::string>> CacheKey::parts() const {
  return {{"program", program},
          {"signature", signature},
          {"graph", graph},
          {"constants", constants},
          {"remat", remat},
          {"donation", donation},
          {"options", options},
          {"device", device},
          {"compiler_version", compiler_version},
          {"format_version", format_version}};
}

namespace {
std::string parts_fingerprint(const std::vector<std::pair<std::string, std::string>>& parts) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  for (const auto& [name, value] : parts) {
    // Length-prefixed, so no two different part lists hash the same byte stream.
    for (const std::string* s : {&name, &value}) {
      const uint64_t n = s->size();
      XXH3_128bits_update(state, &n, sizeof(n));
      XXH3_128bits_update(state, s->data(), s->size());
    }
  }
  std::string fp = hex128(XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return fp;
}

nlohmann::ordered_json parts_json(const std::vector<std::pair<std::string, std::string>>& parts) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, value] : parts) j[name] = value;
  return j;
}
}  // namespace

std::string CacheKey::fingerprint() const { return parts_fingerprint(parts()); }
std::string CacheKey::to_json() const { return parts_json(parts()).dump(); }
std::string IndexKey::fingerprint() const { return parts_fingerprint(parts); }
std::string IndexKey::to_json() const { return parts_json(parts).dump(); }

CacheKey CacheKey::from_json(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail<ValueError>("compilation cache: key is not a JSON object: {:.80}", json);
  auto get = [&](const char* name) {
    if (!j.contains(name) || !j[name].is_string())
      fail<ValueError>("compilation cache: key JSON has no string part \"{}\"", name);
    return j[name].get<std::string>();
  };
  CacheKey k;
  k.program = get("program");
  k.signature = get("signature");
  k.graph = get("graph");
  k.constants = get("constants");
  k.remat = get("remat");
  k.donation = get("donation");
  k.options = get("options");
  k.device = get("device");
  k.compiler_version = get("compiler_version");
  k.format_version = get("format_version");
  return k;
}

CacheKey make_cache_key(const Graph& traced, const std::vector<bool>& donated, const CompileOptions& options,
                        const std::string& device) {
  CacheKey k;
  const std::string text = traced.text();
  k.program = traced.name;
  k.signature = text.substr(0, text.find('\n'));
  k.graph = hex128(XXH3_128bits(text.data(), text.size()));
  k.constants = constants_digest(traced);
  for (const CheckpointPolicy& p : traced.remat_regions) k.remat += (k.remat.empty() ? "" : ";") + p.text();
  for (size_t i = 0; i < traced.parameters.size(); ++i) k.donation += i < donated.size() && donated[i] ? '1' : '0';
  k.options = compile_options_text(options);
  k.device = device;
  k.compiler_version = tessera::version();
  k.format_version = fmt::format("entry={},executable={}", kCompilationCacheFormatVersion, kExecutableFormatVersion);
  return k;
}

std::string compile_options_text(const CompileOptions& options) {
  const char* disabled = flags::env("TESSERA_DISABLE_PASSES");
  std::string text = fmt::format("fuse={},fold_constants={},simplify={},remat={},schedule={},disabled_passes={}",
                                 int(options.fuse), int(options.fold_constants), int(options.simplify),
                                 int(options.remat), int(options.schedule), disabled ? disabled : "");
  if (options.packed_attention) text += ",packed_attention=1";  // CPU programs keep their keys
  return text;
}

bool compilation_index_enabled() {
  const char* env = flags::env("TESSERA_COMPILATION_CACHE_INDEX");
  return env == nullptr || std::string(env) != "0";
}

}  // namespace tessera::compiler
