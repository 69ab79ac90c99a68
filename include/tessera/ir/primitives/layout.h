// Layout primitives: reshape (shares the buffer), transpose, broadcast, slice and
// its transpose (pad into zeros), concatenate; and the two that move a value between
// device and host memory for the offload remat policy (passes/offload.h).
#pragma once

#include <vector>

#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"

namespace tessera {

class Reshape : public Primitive {
 public:
  explicit Reshape(Shape shape) : shape_(std::move(shape)) {}
  const Shape& shape() const { return shape_; }
  std::string name() const override { return "reshape"; }
  int aliases_input(int) const override { return 0; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  Cost cost(const std::vector<Array>&, const std::vector<Array>&) const override { return {}; }

 private:
  Shape shape_;
};

class Transpose : public Primitive {
 public:
  explicit Transpose(std::vector<int> perm) : perm_(std::move(perm)) {}
  const std::vector<int>& perm() const { return perm_; }
  std::string name() const override { return "transpose"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  std::vector<int> perm_;
};

class BroadcastTo : public Primitive {
 public:
  explicit BroadcastTo(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "broadcast_to"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  Shape shape_;
};

// out = a[start:stop:step] per axis (normalized: 0 <= start <= stop <= dim, step >= 1).
class Slice : public Primitive {
 public:
  Slice(std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step)
      : start_(std::move(start)), stop_(std::move(stop)), step_(std::move(step)) {}
  const std::vector<int64_t>& start() const { return start_; }
  const std::vector<int64_t>& stop() const { return stop_; }
  const std::vector<int64_t>& step() const { return step_; }
  std::string name() const override { return "slice"; }
  std::string attributes() const override;
  // Reads only the sliced elements (not the whole input) and writes them.
  Cost cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  std::vector<int64_t> start_, stop_, step_;
};

// The transpose of Slice: zeros of `shape` with the input written at the slice.
class SlicePad : public Primitive {
 public:
  SlicePad(Shape shape, std::vector<int64_t> start, std::vector<int64_t> step)
      : shape_(std::move(shape)), start_(std::move(start)), step_(std::move(step)) {}
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& start() const { return start_; }
  const std::vector<int64_t>& step() const { return step_; }
  std::string name() const override { return "slice_pad"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  Shape shape_;
  std::vector<int64_t> start_, step_;
};

class Concatenate : public Primitive {
 public:
  explicit Concatenate(int axis) : axis_(axis) {}
  int axis() const { return axis_; }
  std::string name() const override { return "concatenate"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  int axis_;
};

// Identity on values, moving them between memories. The offload pass inserts them
// after autodiff (their vjps, identities, exist for completeness). On the CPU both
// are copies between the device arena and the host arena; the CUDA executable runs
// them as copies to and from pinned memory on a side stream (backend/cuda/host_offload.h).
class OffloadToHost : public Primitive {
 public:
  std::string name() const override { return "offload_to_host"; }
  bool output_in_host_memory(int) const override { return true; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COST
};

class LoadFromHost : public Primitive {
 public:
  std::string name() const override { return "load_from_host"; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COST
};

}  // namespace tessera
