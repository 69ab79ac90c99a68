#include "tessera/core/array.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <unordered_set>

#include "core/trace_state.h"
#include "tessera/base/allocator.h"
#include "tessera/core/graph.h"
#include "tessera/core/ops.h"
#include "tessera/core/runtime_hooks.h"

namespace tessera {

Storage::Storage(size_t n) : bytes(n) { data = allocate_buffer(n, &capacity); }

std::shared_ptr<Storage> Storage::view(void* data, size_t bytes) {
  std::shared_ptr<Storage> s(new Storage());
  s->data = data;
  s->bytes = bytes;
  s->owned = false;
  return s;
}

Storage::~Storage() {
  if (owned) free_buffer(data, capacity);
}

namespace {
std::atomic<uint64_t> g_next_id{0};

std::shared_ptr<detail::ArrayImpl> new_impl(Shape shape, DType dtype) {
  auto impl = std::make_shared<detail::ArrayImpl>();
  numel(shape, "array");
  impl->shape = std::move(shape);
  impl->dtype = dtype;
  impl->id = g_next_id.fetch_add(1);
  return impl;
}
}  // namespace

Array Array::from_data(const void* data, const Shape& shape, DType dtype) {
  Array a(new_impl(shape, dtype));
  a.allocate();
  if (a.nbytes() > 0) std::memcpy(a.impl()->storage->data, data, a.nbytes());
  return a;
}

Array Array::empty(const Shape& shape, DType dtype) {
  Array a(new_impl(shape, dtype));
  a.allocate();
  return a;
}

Array Array::placeholder(const Shape& shape, DType dtype) { return Array(new_impl(shape, dtype)); }

Array Array::scalar(double value, DType dtype) {
  Array a(new_impl({}, dtype));
  a.allocate();
  store_from_double(dtype, a.impl()->storage->data, 0, value);
  return a;
}

std::vector<Array> Array::make(std::vector<Shape> shapes, std::vector<DType> dtypes, PrimitivePtr primitive,
                               std::vector<Array> inputs) {
  auto op = std::make_shared<detail::OpNode>();
  op->primitive = std::move(primitive);
  op->inputs = std::move(inputs);
  op->output_shapes = shapes;
  op->output_dtypes = dtypes;
  op->remat_region = detail::current_checkpoint_region();
  std::vector<Array> outputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto impl = new_impl(std::move(shapes[i]), dtypes[i]);
    impl->op = op;
    impl->output_index = static_cast<int>(i);
    op->outputs.push_back(impl);
    outputs.emplace_back(std::move(impl));
  }
  if (detail::eager_mode()) {
    bool ready = true;
    for (const Array& in : op->inputs) ready = ready && in.is_evaluated();
    if (ready) tessera::eval(outputs);
  }
  return outputs;
}

detail::ArrayImpl* Array::impl() const {
  if (!impl_) fail<ValueError>("use of an empty (default-constructed) Array");
  return impl_.get();
}

int64_t Array::shape(int axis) const { return shape()[normalize_axis(axis, ndim(), "shape")]; }

const PrimitivePtr& Array::primitive() const {
  static const PrimitivePtr kNone;
  return impl()->op ? impl()->op->primitive : kNone;
}

const std::vector<Array>& Array::inputs() const {
  static const std::vector<Array> kNone;
  return impl()->op ? impl()->op->inputs : kNone;
}

std::vector<Array> Array::siblings() const {
  auto& op = impl()->op;
  if (!op) return {*this};
  std::vector<Array> out;
  for (size_t i = 0; i < op->outputs.size(); ++i) {
    auto locked = op->outputs[i].lock();
    if (!locked) {
      // Nobody held this output: recreate its handle on the same application so
      // rules (vjp, vmap) and eval can use it. The op node keeps only weak links to
      // its outputs, so there is no reference cycle.
      locked = new_impl(op->output_shapes[i], op->output_dtypes[i]);
      locked->op = op;
      locked->output_index = static_cast<int>(i);
      op->outputs[i] = locked;
    }
    out.emplace_back(std::move(locked));
  }
  return out;
}

void Array::check_type(DType requested) const {
  if (requested != dtype())
    fail<DTypeError>("data: requested {} data from an array of dtype {}", name(requested), name(dtype()));
}

const void* Array::raw_data() const {
  eval();
  return impl()->storage->data;
}

void* Array::mutable_raw_data() const {
  if (!impl()->storage) fail<Error>("mutable_data: array {} is not allocated", type_string(*this));
  return impl()->storage->data;
}

void Array::allocate() const {
  auto& storage = impl()->storage;
  if (storage && storage->bytes >= nbytes()) return;
  storage = std::make_shared<Storage>(nbytes());
}

void Array::bind_storage(std::shared_ptr<Storage> storage) const { impl()->storage = std::move(storage); }

void Array::share_storage(const Array& source) const { impl()->storage = source.impl()->storage; }

const Array& Array::eval() const {
  if (!is_evaluated()) tessera::eval({*this});
  return *this;
}

Array Array::T() const { return transpose(*this); }
Array Array::astype(DType d) const { return tessera::astype(*this, d); }
Array Array::reshape(const Shape& s) const { return tessera::reshape(*this, s); }
Array Array::sum() const { return tessera::sum(*this); }
Array Array::mean() const { return tessera::mean(*this); }

void eval(const std::vector<Array>& arrays) { detail::evaluate_graph(arrays); }

std::string type_string(const Array& a) {
  std::string s(short_name(a.dtype()));
  return s + to_string(a.shape());
}

std::ostream& operator<<(std::ostream& os, const Array& a) {
  os << "array(" << type_string(a) << ", [";
  std::vector<double> values = a.to_vector<double>();
  size_t shown = std::min<size_t>(values.size(), 64);
  for (size_t i = 0; i < shown; ++i) {
    if (i) os << ", ";
    os << values[i];
  }
  if (shown < values.size()) os << ", ...";
  return os << "])";
}

}  // namespace tessera
