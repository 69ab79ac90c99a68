// Creation ops: leaves that hold their data from the start.
#include <cmath>

#include "backend/cpu/kernels/elementwise.h"
#include "tessera/core/abstract_creation.h"
#include "tessera/core/ops.h"

namespace tessera {

namespace {
thread_local bool t_abstract_creation = false;
}  // namespace

AbstractCreationScope::AbstractCreationScope() : previous_(t_abstract_creation) { t_abstract_creation = true; }
AbstractCreationScope::~AbstractCreationScope() { t_abstract_creation = previous_; }
bool abstract_creation() { return t_abstract_creation; }

Array full(const Shape& shape, double value, DType dtype) {
  numel(shape, "full");
  if (t_abstract_creation) return Array::placeholder(shape, dtype);
  Array a = Array::empty(shape, dtype);
  cpu::fill(dtype, value, a.mutable_raw_data(), a.size());
  return a;
}

Array zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Array ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Array zeros_like(const Array& a) { return zeros(a.shape(), a.dtype()); }
Array ones_like(const Array& a) { return ones(a.shape(), a.dtype()); }

Array arange(double start, double stop, double step, DType dtype) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    fail<ValueError>("arange: start={}, stop={}, step={} (expected finite values and step != 0)", start, stop, step);
  double count = std::ceil((stop - start) / step);
  if (count > 9.0e15) fail<ShapeError>("arange: {} elements is too many", count);
  int64_t n = std::max<int64_t>(0, static_cast<int64_t>(count));
  Array a = zeros({n}, dtype);
  void* data = a.mutable_raw_data();
  for (int64_t i = 0; i < n; ++i) store_from_double(dtype, data, i, start + static_cast<double>(i) * step);
  return a;
}

Array arange(int64_t stop, DType dtype) { return arange(0.0, static_cast<double>(stop), 1.0, dtype); }

}  // namespace tessera
