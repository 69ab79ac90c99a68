// Reductions over a sorted set of axes (the reduced dims are removed; keepdims is
// a reshape in the op layer).
#pragma once

#include <vector>

#include "tessera/ir/primitive.h"

namespace tessera {

enum class ReduceKind { Sum, Prod, Max, Min };

class Reduce : public Primitive {
 public:
  Reduce(ReduceKind kind, std::vector<int> axes) : kind_(kind), axes_(std::move(axes)) {}
  ReduceKind kind() const { return kind_; }
  const std::vector<int>& axes() const { return axes_; }
  std::string name() const override;
  std::string attributes() const override;
  void eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) override;
  std::vector<Array> vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                         const std::vector<int>& argnums, const std::vector<Array>& outputs) override;
  std::pair<std::vector<Array>, std::vector<int>> vmap(const std::vector<Array>& inputs,
                                                       const std::vector<int>& axes) override;
  Cost cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const override;

 private:
  ReduceKind kind_;
  std::vector<int> axes_;
};

// Index of the max/min along one axis (int64). Not differentiable (integer output).
class ArgReduce : public Primitive {
 public:
  ArgReduce(bool is_max, int axis) : is_max_(is_max), axis_(axis) {}
  std::string name() const override { return is_max_ ? "argmax" : "argmin"; }
  std::string attributes() const override;
  void eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) override;
  std::pair<std::vector<Array>, std::vector<int>> vmap(const std::vector<Array>& inputs,
                                                       const std::vector<int>& axes) override;

 private:
  bool is_max_;
  int axis_;
};

}  // namespace tessera
