// The small models the pipeline tests share (test_pipeline.cpp, test_pipeline_step.cpp):
// 4 layers, so 2 and 4 stages both fit; GPT-2 (tied embedding) or Llama (untied head, GQA).
#pragma once

#include <cstdint>
#include <string>

#include "tessera/models/model.h"

namespace tessera::testing {

inline constexpr int64_t kPipelineBatch = 8, kPipelineSeq = 16;

inline models::ModelConfig pipeline_test_model(const std::string& family) {
  models::ModelConfig c;
  c.family = family;
  c.vocab = 64;
  c.dim = 32;
  c.layers = 4;
  c.heads = 2;
  c.kv_heads = family == "llama" ? 1 : 0;
  c.context = kPipelineSeq;
  return c;
}

}  // namespace tessera::testing
