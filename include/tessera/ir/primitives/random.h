// Random primitives over uint32[2] Philox keys. Not differentiable; batching over
// keys loops (each key is an independent stream).
#pragma once

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"

namespace tessera {

class RandomSplit : public Primitive {
 public:
  explicit RandomSplit(int64_t num) : num_(num) {}
  std::string name() const override { return "random_split"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP

 private:
  int64_t num_;
};

enum class Distribution { Uniform, Normal };

class RandomSample : public Primitive {
 public:
  RandomSample(Distribution dist, double a, double b, Shape shape, DType dtype)
      : dist_(dist), a_(a), b_(b), shape_(std::move(shape)), dtype_(dtype) {}
  std::string name() const override { return dist_ == Distribution::Uniform ? "random_uniform" : "random_normal"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP

 private:
  Distribution dist_;
  double a_, b_;  // [low, high) or (mean, stddev)
  Shape shape_;
  DType dtype_;
};

// Inputs: key, p (broadcast to the output shape).
class RandomBernoulli : public Primitive {
 public:
  std::string name() const override { return "random_bernoulli"; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VMAP
};

}  // namespace tessera
