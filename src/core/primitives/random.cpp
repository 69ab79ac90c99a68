// Batching rules of random primitives: each key is its own stream, so a batch of
// keys samples each in turn.
#include "tessera/ir/primitives/random.h"

#include <fmt/format.h>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"

namespace tessera {

std::string RandomSplit::attributes() const { return fmt::format("num={}", num_); }

std::string RandomSample::attributes() const {
  return fmt::format("{}={}, {}={}, shape={}, dtype={}", dist_ == Distribution::Uniform ? "low" : "mean", a_,
                     dist_ == Distribution::Uniform ? "high" : "stddev", b_, to_string(shape_), tessera::name(dtype_));
}

std::pair<std::vector<Array>, std::vector<int>> RandomSplit::vmap(const std::vector<Array>& inputs,
                                                                  const std::vector<int>& axes) {
  int64_t num = num_;
  return rules::loop_vmap([num](const std::vector<Array>& in) { return std::vector<Array>{random::split(in[0], num)}; },
                          inputs, axes, "random_split");
}

std::pair<std::vector<Array>, std::vector<int>> RandomSample::vmap(const std::vector<Array>& inputs,
                                                                   const std::vector<int>& axes) {
  Distribution dist = dist_;
  double a = a_, b = b_;
  Shape shape = shape_;
  DType dtype = dtype_;
  return rules::loop_vmap(
      [=](const std::vector<Array>& in) {
        return std::vector<Array>{dist == Distribution::Uniform ? random::uniform(in[0], shape, dtype, a, b)
                                                                : random::normal(in[0], shape, dtype, a, b)};
      },
      inputs, axes, "random_sample");
}

std::pair<std::vector<Array>, std::vector<int>> RandomBernoulli::vmap(const std::vector<Array>& inputs,
                                                                      const std::vector<int>& axes) {
  return rules::loop_vmap(
      [](const std::vector<Array>& in) { return std::vector<Array>{random::bernoulli(in[0], in[1], in[1].shape())}; },
      inputs, axes, "random_bernoulli");
}

}  // namespace tessera
