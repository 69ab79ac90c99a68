// Parameters of nn/ modules: how each one is initialized, which logical axes its
// dimensions carry (the SPMD issue maps logical axis names to mesh axes, as MaxText's
// logical_axis_rules do) and whether weight decay applies to it.
//
// A module declares its parameters through a ParamScope:
//
//   Tree Linear::init(ParamScope scope) const {
//     Tree p;
//     p["w"] = scope.param("w", {.shape = {in, out}, .axes = {"embed", "mlp"}, .init = Initializer::normal(0.02)});
//     ...
//   }
//
// Every parameter draws from its own key, derived from the seed and its full path
// ("layers.3.attn.wqkv"), so adding or reordering parameters never changes the values
// of the others, and the result is bitwise the same on every run and thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/array.h"

namespace tessera::nn {

// One logical axis name per dimension, e.g. {"embed", "mlp"} or {"vocab", "embed"}.
using AxisNames = std::vector<std::string>;

struct Initializer {
  enum class Kind { Normal, TruncatedNormal, Uniform, Zeros, Ones, Constant };
  Kind kind = Kind::Normal;
  double stddev = 0.02;      // Normal, TruncatedNormal (truncated at ±2 stddev)
  double low = 0, high = 0;  // Uniform
  double value = 0;          // Constant

  static Initializer normal(double stddev) { return {Kind::Normal, stddev}; }
  static Initializer truncated_normal(double stddev) { return {Kind::TruncatedNormal, stddev}; }
  static Initializer uniform(double low, double high) { return {Kind::Uniform, 0, low, high}; }
  static Initializer zeros() { return {Kind::Zeros}; }
  static Initializer ones() { return {Kind::Ones}; }
  static Initializer constant(double v) { return {Kind::Constant, 0, 0, 0, v}; }

  // The values for `shape`, drawn from `key` (a random::key-style uint32[2]).
  Array operator()(const Array& key, const Shape& shape, DType dtype) const;
  std::string to_string() const;  // "normal(0.02)", "zeros", ...
};

// What a parameter is, for the optimizer's default weight-decay rule (no decay on
// norms, biases and embeddings) and for reports.
enum class ParamKind { Weight, Bias, Norm, Embedding };
const char* to_string(ParamKind kind);

struct ParamInfo {
  Shape shape;
  DType dtype = DType::Float32;
  AxisNames axes;  // one per dimension of `shape` (checked by ParamScope::param)
  Initializer init;
  ParamKind kind = ParamKind::Weight;
};

// Path (Tree::paths() form, "layers.0.attn.wqkv") -> info, for every parameter.
using ParamSpecs = std::map<std::string, ParamInfo>;

// Where modules declare parameters. Copies share one spec table; child() extends
// the path. The dtype of every parameter is the scope's (float32 unless set).
class ParamScope {
 public:
  explicit ParamScope(uint64_t seed, DType dtype = DType::Float32);
  // A scope that records specs only: param() returns placeholders (no memory, no
  // random draws), so the specs of a billion-parameter model cost nothing.
  static ParamScope specs_only(DType dtype = DType::Float32);
  // A scope whose param() initializes only the parameters `materialize` accepts (by
  // path); the others are placeholders, drawn nothing for (a pipeline process builds only
  // its stages' parameters).
  ParamScope only(std::function<bool(const std::string& path)> materialize) const;

  ParamScope child(const std::string& name) const;
  ParamScope child(size_t index) const { return child(std::to_string(index)); }

  // Registers `info` under path()+"."+name and returns the initialized value. A path
  // declared twice, or axes whose count differs from the shape's rank, is a ValueError.
  Array param(const std::string& name, ParamInfo info) const;

  const std::string& path() const { return path_; }
  uint64_t seed() const { return seed_; }
  const ParamSpecs& specs() const { return *specs_; }
  DType dtype() const { return dtype_; }
  bool is_specs_only() const { return specs_only_; }

 private:
  ParamScope(uint64_t seed, DType dtype, std::string path, std::shared_ptr<ParamSpecs> specs, bool specs_only,
             std::shared_ptr<const std::function<bool(const std::string&)>> materialize)
      : seed_(seed),
        dtype_(dtype),
        path_(std::move(path)),
        specs_(std::move(specs)),
        specs_only_(specs_only),
        materialize_(std::move(materialize)) {}
  uint64_t seed_;
  DType dtype_;
  std::string path_;
  std::shared_ptr<ParamSpecs> specs_;
  bool specs_only_ = false;
  std::shared_ptr<const std::function<bool(const std::string&)>> materialize_;  // null: every parameter
};

// The key of the parameter at `path` for `seed` (a stable hash of both).
Array param_key(uint64_t seed, const std::string& path);

// Total number of elements of the parameters in `specs`.
int64_t parameter_count(const ParamSpecs& specs);

}  // namespace tessera::nn
