// Random ops over Philox keys.
#include "tessera/core/random.h"

#include "tessera/core/ops.h"
#include "tessera/ir/primitives/random.h"

namespace tessera {
namespace {

void check_key(const Array& key, const char* op) {
  if (key.dtype() != DType::UInt32 || key.shape() != Shape{2})
    fail<ValueError>("{}: key must be a uint32 array of shape [2] (from tessera::key or random::split); got {}", op,
                     type_string(key));
}

void check_float(DType dtype, const char* op) {
  if (!is_floating(dtype)) fail<DTypeError>("{}: dtype {} is not a floating dtype", op, name(dtype));
}

}  // namespace

Array key(uint64_t seed) {
  std::vector<uint32_t> words{static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(seed & 0xffffffffu)};
  return Array::from_vector(words, {2});
}

namespace random {

Array split(const Array& key, int64_t num) {
  check_key(key, "random::split");
  if (num < 0) fail<ValueError>("random::split: num={} (expected >= 0)", num);
  return Array::make({num, 2}, DType::UInt32, std::make_shared<RandomSplit>(num), {key});
}

std::vector<Array> split_keys(const Array& key, int64_t num) {
  Array keys = split(key, num);
  std::vector<Array> out;
  for (int64_t i = 0; i < num; ++i) out.push_back(reshape(slice_axis(keys, 0, i, i + 1), {2}));
  return out;
}

Array uniform(const Array& key, const Shape& shape, DType dtype, double low, double high) {
  check_key(key, "random::uniform");
  check_float(dtype, "random::uniform");
  if (!(low < high)) fail<ValueError>("random::uniform: low={} must be < high={}", low, high);
  numel(shape, "random::uniform");
  return Array::make(shape, dtype, std::make_shared<RandomSample>(Distribution::Uniform, low, high, shape, dtype),
                     {key});
}

Array normal(const Array& key, const Shape& shape, DType dtype, double mean, double stddev) {
  check_key(key, "random::normal");
  check_float(dtype, "random::normal");
  if (!(stddev >= 0)) fail<ValueError>("random::normal: stddev={} must be >= 0", stddev);
  numel(shape, "random::normal");
  return Array::make(shape, dtype, std::make_shared<RandomSample>(Distribution::Normal, mean, stddev, shape, dtype),
                     {key});
}

Array bernoulli(const Array& key, const Array& p, const Shape& shape) {
  check_key(key, "random::bernoulli");
  check_float(p.dtype(), "random::bernoulli (p)");
  broadcast_shapes(p.shape(), shape, "random::bernoulli");
  Array pb = broadcast_to(p, broadcast_shapes(p.shape(), shape, "random::bernoulli"));
  if (pb.shape() != shape)
    fail<ShapeError>("random::bernoulli: p of shape {} does not broadcast to {}", to_string(p.shape()),
                     to_string(shape));
  return Array::make(shape, DType::Bool, std::make_shared<RandomBernoulli>(), {key, pb});
}

Array bernoulli(const Array& key, double p, const Shape& shape) {
  if (!(p >= 0 && p <= 1)) fail<ValueError>("random::bernoulli: p={} is not a probability in [0, 1]", p);
  return bernoulli(key, full({}, p, DType::Float32), shape);
}

}  // namespace random
}  // namespace tessera
