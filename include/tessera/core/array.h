// Array: a lazy handle to a node of the computation graph (MLX-style). Ops build
// the graph; eval() runs it. Arrays are immutable values with reference semantics:
// copying an Array copies the handle, not the data. Data is always dense row-major.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"

namespace tessera {

namespace spmd {
struct ShardedData;  // spmd/api.h
}
namespace backend {
struct DeviceData;  // backend/device_data.h
}

// A 64-byte aligned host buffer shared by the arrays that view it (from the
// caching allocator in base/allocator.h), or a view of memory owned elsewhere (a
// compiled executable's arena): then nothing is freed.
struct Storage {
  explicit Storage(size_t bytes);
  static std::shared_ptr<Storage> view(void* data, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  size_t bytes = 0;
  size_t capacity = 0;
  bool owned = true;

 private:
  Storage() = default;
};

namespace detail {
struct ArrayImpl;
// One application of a primitive; its outputs are the sibling arrays.
struct OpNode {
  PrimitivePtr primitive;
  std::vector<Array> inputs;
  std::vector<std::weak_ptr<ArrayImpl>> outputs;
  // Types of every output, so eval can give a dropped output a scratch buffer.
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  // Rematerialization tags (core/checkpoint.h): the checkpoint region the op was
  // created in (-1: none) and the name checkpoint_name gave its output.
  int remat_region = -1;
  std::string remat_name;
};
struct ArrayImpl {
  Shape shape;
  DType dtype = DType::Float32;
  std::shared_ptr<OpNode> op;  // null for a leaf
  int output_index = 0;
  std::shared_ptr<Storage> storage;  // set once evaluated
  uint64_t id = 0;                   // creation order: unique, deterministic
  // A sharded array (spmd/api.h): a leaf whose data lives in per-device shards;
  // storage is filled with the assembled global value when someone reads it.
  std::shared_ptr<const spmd::ShardedData> shards;
  // A value in accelerator memory (backend/device_data.h): a GPU program's output.
  // storage is filled with a host copy when someone reads it; the device copy stays.
  std::shared_ptr<const backend::DeviceData> device_data;
};
}  // namespace detail

class Array {
 public:
  Array() = default;

  // A leaf holding a copy of host data (n = numel(shape) elements of `dtype`).
  static Array from_data(const void* data, const Shape& shape, DType dtype);
  template <typename V>
  static Array from_vector(const std::vector<V>& values, const Shape& shape);
  template <typename V>
  static Array from_vector(const std::vector<V>& values) {
    return from_vector(values, Shape{static_cast<int64_t>(values.size())});
  }
  // A leaf with allocated, uninitialized storage.
  static Array empty(const Shape& shape, DType dtype);
  // A leaf with no data: a stand-in for a value a transform supplies later (vmap
  // traces functions on these). Evaluating it is an error.
  static Array placeholder(const Shape& shape, DType dtype);
  // A scalar (shape []) of `dtype`.
  static Array scalar(double value, DType dtype = DType::Float32);

  // Outputs of one primitive application (the op functions' building block).
  static std::vector<Array> make(std::vector<Shape> shapes, std::vector<DType> dtypes, PrimitivePtr primitive,
                                 std::vector<Array> inputs);
  static Array make(Shape shape, DType dtype, PrimitivePtr primitive, std::vector<Array> inputs) {
    return make(std::vector<Shape>{std::move(shape)}, std::vector<DType>{dtype}, std::move(primitive),
                std::move(inputs))[0];
  }

  bool valid() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl()->shape; }
  int64_t shape(int axis) const;
  int ndim() const { return static_cast<int>(shape().size()); }
  int64_t size() const { return numel(shape()); }
  DType dtype() const { return impl()->dtype; }
  size_t itemsize() const { return tessera::itemsize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(size()) * itemsize(); }
  uint64_t id() const { return impl()->id; }
  bool is_same(const Array& other) const { return impl_ == other.impl_; }

  // Graph structure.
  bool is_leaf() const { return impl()->op == nullptr; }
  bool is_evaluated() const { return impl()->storage != nullptr; }
  // A leaf with no data and nothing to compute it from (Array::placeholder): shards or a
  // device copy count as data.
  bool is_placeholder() const {
    return is_leaf() && !is_evaluated() && impl()->shards == nullptr && impl()->device_data == nullptr;
  }
  const PrimitivePtr& primitive() const;
  const std::vector<Array>& inputs() const;
  int output_index() const { return impl()->output_index; }
  // All outputs of this array's primitive application (including itself).
  std::vector<Array> siblings() const;

  // Runs the graph that produces this array (no-op when evaluated).
  const Array& eval() const;

  // Raw data; evaluates first. T must match dtype() exactly.
  template <typename V>
  const V* data() const;
  const void* raw_data() const;
  // Mutable data for kernels filling an output (the array must be allocated).
  void* mutable_raw_data() const;
  template <typename V>
  V* mutable_data() const {
    check_type(dtype_v<V>);
    return static_cast<V*>(mutable_raw_data());
  }
  // Values converted to T (any source dtype); evaluates first.
  template <typename V>
  std::vector<V> to_vector() const;
  // The value of a size-1 array.
  template <typename V>
  V item() const;

  // Allocation used by eval_cpu implementations. A no-op when the array already has
  // a buffer of its size (the executable binds arena buffers before it runs a kernel).
  void allocate() const;
  // Binds `storage` as this array's buffer (executables, donation); null unbinds.
  void bind_storage(std::shared_ptr<Storage> storage) const;
  const std::shared_ptr<Storage>& storage() const { return impl()->storage; }
  void share_storage(const Array& source) const;  // same bytes, e.g. reshape

  // Convenience methods (see ops.h).
  Array T() const;
  Array astype(DType dtype) const;
  Array reshape(const Shape& shape) const;
  Array sum() const;
  Array mean() const;

  detail::ArrayImpl* impl() const;
  const std::shared_ptr<detail::ArrayImpl>& impl_ptr() const { return impl_; }
  explicit Array(std::shared_ptr<detail::ArrayImpl> impl) : impl_(std::move(impl)) {}

 private:
  void check_type(DType requested) const;
  std::shared_ptr<detail::ArrayImpl> impl_;
};

// Evaluates several arrays in one pass over their shared graph. The graph is
// compiled like a jitted function (compiler/eager.h; executables cached by the
// graph's text) and run by the same engine.
void eval(const std::vector<Array>& arrays);

namespace detail {
// Eager mode: while an EagerScope is alive on this thread, every op whose inputs
// have values is evaluated as soon as it is created (PyTorch-style execution; the
// baseline jit is measured against).
bool eager_mode();
class EagerScope {
 public:
  EagerScope();
  ~EagerScope();
  EagerScope(const EagerScope&) = delete;
  EagerScope& operator=(const EagerScope&) = delete;
};
}  // namespace detail

// "f32[2, 3]".
std::string type_string(const Array& a);
// Prints dtype, shape and values (numpy-like, summarized when large).
std::ostream& operator<<(std::ostream& os, const Array& a);

// ---- templates ----
template <typename V>
Array Array::from_vector(const std::vector<V>& values, const Shape& shape) {
  if (static_cast<int64_t>(values.size()) != numel(shape, "from_vector"))
    fail<ShapeError>("from_vector: {} values cannot fill shape {} ({} elements expected)", values.size(),
                     to_string(shape), numel(shape));
  if constexpr (std::is_same_v<V, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return from_data(bytes.data(), shape, DType::Bool);
  } else {
    return from_data(values.data(), shape, dtype_v<V>);
  }
}

template <typename V>
const V* Array::data() const {
  check_type(dtype_v<V>);
  return static_cast<const V*>(raw_data());
}

template <typename V>
std::vector<V> Array::to_vector() const {
  std::vector<V> out(static_cast<size_t>(size()));
  if constexpr (std::is_same_v<V, bool>) {
    std::vector<uint8_t> bytes(out.size());
    convert(dtype(), raw_data(), DType::Bool, bytes.data(), size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bytes[i] != 0;
  } else {
    convert(dtype(), raw_data(), dtype_v<V>, out.data(), size());
  }
  return out;
}

template <typename V>
V Array::item() const {
  if (size() != 1) fail<ShapeError>("item: array of shape {} has {} elements (expected 1)", to_string(shape()), size());
  return to_vector<V>()[0];
}

}  // namespace tessera
