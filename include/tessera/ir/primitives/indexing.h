// Gather / scatter-add along one axis: take (embedding lookup), take_along_axis,
// and their transposes.
#pragma once

#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"

namespace tessera {

// take(a, indices, axis): a.shape[:axis] + indices.shape + a.shape[axis+1:].
class Take : public Primitive {
 public:
  explicit Take(int axis) : axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "take"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  int axis_;
};

// The transpose of Take: zeros of `shape` with updates (indices, values) added at the
// gathered positions. Inputs: (indices, updates).
class TakeScatterAdd : public Primitive {
 public:
  TakeScatterAdd(Shape shape, int axis) : shape_(std::move(shape)), axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "scatter_add"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP

  TESSERA_PRIMITIVE_VMAP

 private:
  Shape shape_;
  int axis_;
};

// take_along_axis(a, indices, axis): indices has a's rank and shape except along axis.
class TakeAlong : public Primitive {
 public:
  explicit TakeAlong(int axis) : axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "take_along_axis"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP

  TESSERA_PRIMITIVE_VMAP

 private:
  int axis_;
};

class TakeAlongScatterAdd : public Primitive {
 public:
  TakeAlongScatterAdd(Shape shape, int axis) : shape_(std::move(shape)), axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "scatter_add_along_axis"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP

  TESSERA_PRIMITIVE_VMAP

 private:
  Shape shape_;
  int axis_;
};

}  // namespace tessera
