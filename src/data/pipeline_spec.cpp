#include "tessera/data/pipeline_spec.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cmath>

#include "tessera/base/error.h"

namespace tessera::data {

void PipelineSpec::validate() const {
  if (sources.empty()) fail<ConfigError>("data.mixture: no sources");
  double sum = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const SourceSpec& s = sources[i];
    const std::string name = s.name.empty() ? s.path : s.name;
    if (s.path.empty()) fail<ConfigError>("data.mixture[{}] ('{}'): no path", i, name);
    if (!std::isfinite(s.weight) || s.weight < 0)
      fail<ConfigError>("data.mixture[{}] ('{}'): weight {} must be a finite number >= 0", i, name, s.weight);
    if (s.kind != "auto" && s.kind != "tokens" && s.kind != "text")
      fail<ConfigError>("data.mixture[{}] ('{}'): kind '{}' is unknown (expected auto, tokens or text)", i, name,
                        s.kind);
    sum += s.weight;
  }
  if (!(sum > 0)) {
    std::string listed;
    for (const SourceSpec& s : sources)
      listed += fmt::format("{}'{}' = {}", listed.empty() ? "" : ", ", s.name.empty() ? s.path : s.name, s.weight);
    fail<ConfigError>("data.mixture: the weights sum to {} ({}); they must sum to a positive number", sum, listed);
  }
  if (packing != "documents" && packing != "concat")
    fail<ConfigError>("data.packing: '{}' is unknown (expected documents or concat)", packing);
  if (shuffle_buffer < 0) fail<ConfigError>("data.shuffle_buffer: {} must be >= 0 rows", shuffle_buffer);
  if (workers < 0) fail<ConfigError>("data.workers: {} must be >= 0", workers);
  if (prefetch < 1) fail<ConfigError>("data.prefetch: {} must be >= 1 batch", prefetch);
}

uint64_t PipelineSpec::fingerprint() const {
  std::string text = fmt::format("packing={};buffer={};", packing, shuffle_buffer > 1 ? shuffle_buffer : 0);
  for (const SourceSpec& s : sources)
    text += fmt::format("source={}|{}|{:.17g}|{}|{};", s.name, s.path, s.weight, s.kind, s.documents);
  return XXH3_64bits(text.data(), text.size());
}

}  // namespace tessera::data
