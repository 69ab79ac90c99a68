// What the pipeline tests share (test_pipeline*.cpp): the small models (4 layers, so 2
// and 4 stages both fit; GPT-2 with a tied embedding or Llama with an untied head and
// GQA), random token batches, pipeline options, and a tree comparison.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/models/model.h"
#include "tessera/train/pipeline.h"

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

// Random token ids [kPipelineBatch, kPipelineSeq] in [0, 63].
inline Array random_pipeline_ids(uint32_t seed) {
  std::vector<int64_t> v = test::random_ints(kPipelineBatch * kPipelineSeq, seed, 0, 63);
  return Array::from_vector(std::vector<int32_t>(v.begin(), v.end()), {kPipelineBatch, kPipelineSeq});
}

// Options of a pipeline of `devices` devices; with a mesh, its stages partitioned over it.
inline train::PipelineOptions pipeline_options(train::PipelineKind kind, int devices, int micro_batches,
                                               int virtual_stages, const std::string& mesh = "") {
  train::PipelineOptions o;
  o.kind = kind;
  o.devices = devices;
  o.micro_batches = micro_batches;
  o.virtual_stages = virtual_stages;
  if (!mesh.empty()) o.mesh = spmd::Mesh::parse(mesh);
  return o;
}

// Every leaf within `rtol` (relative 2-norm, spmd_test_util.h), named by its path.
inline void expect_trees_close(const Tree& got, const Tree& want, double rtol, const std::string& what) {
  const std::vector<std::string> paths = want.paths();
  const std::vector<Array> x = got.leaves(), y = want.leaves();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) expect_close(x[i], y[i], rtol, what + " " + paths[i]);
}

}  // namespace tessera::testing
