// Counter-based random numbers (Philox-4x32-10) with explicit, splittable keys
// (JAX's model). A key is a uint32 array of shape [2]. Every value is a pure function
// of (key, shape, index): bitwise identical across runs and thread counts.
#pragma once

#include "tessera/core/array.h"

namespace tessera {

Array key(uint64_t seed);

namespace random {

// num keys derived from `key`, shape [num, 2]; take one with split(k, n)[i] via
// slice or the vector form below.
Array split(const Array& key, int64_t num = 2);
std::vector<Array> split_keys(const Array& key, int64_t num = 2);
// Uniform in [low, high).
Array uniform(const Array& key, const Shape& shape, DType dtype = DType::Float32, double low = 0, double high = 1);
// Normal(mean, stddev).
Array normal(const Array& key, const Shape& shape, DType dtype = DType::Float32, double mean = 0, double stddev = 1);
// Bool array, true with probability p (p broadcast to shape).
Array bernoulli(const Array& key, const Array& p, const Shape& shape);
Array bernoulli(const Array& key, double p, const Shape& shape);

}  // namespace random
}  // namespace tessera
