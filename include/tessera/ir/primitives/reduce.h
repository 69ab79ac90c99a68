// Reductions over a sorted set of axes (the reduced dims are removed; keepdims is
// a reshape in the op layer).
#pragma once

#include <vector>

#include "tessera/base/op_list.h"
#include "tessera/ir/primitive.h"

namespace tessera {

// ReduceKind: base/op_list.h.

class Reduce : public Primitive {
 public:
  Reduce(ReduceKind kind, std::vector<int> axes) : kind_(kind), axes_(std::move(axes)) {}
  ReduceKind kind() const { return kind_; }
  const std::vector<int>& axes() const { return axes_; }
  std::string name() const override;
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COST

 private:
  ReduceKind kind_;
  std::vector<int> axes_;
};

// Index of the max/min along one axis (int64). Not differentiable (integer output).
class ArgReduce : public Primitive {
 public:
  ArgReduce(bool is_max, int axis) : is_max_(is_max), axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return is_max_ ? "argmax" : "argmin"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP

 private:
  bool is_max_;
  int axis_;
};

}  // namespace tessera
