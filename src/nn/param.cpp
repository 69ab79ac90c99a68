#include "tessera/nn/param.h"

#include <fmt/format.h>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"

namespace tessera::nn {

namespace {

// FNV-1a of the path, then mixed with the seed by splitmix64's finalizer: distinct
// (seed, path) pairs give unrelated 64-bit seeds for random::key.
uint64_t path_seed(uint64_t seed, const std::string& path) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : path) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

Array Initializer::operator()(const Array& key, const Shape& shape, DType dtype) const {
  switch (kind) {
    case Kind::Normal:
      return random::normal(key, shape, dtype, 0, stddev);
    case Kind::TruncatedNormal: {
      // Resample-free truncation: clip a normal draw to ±2 stddev (as torch's
      // trunc_normal_ does in effect for the rare tail values, within float rounding).
      Array x = random::normal(key, shape, DType::Float32, 0, stddev);
      return astype(minimum(maximum(x, scalar_like(-2 * stddev, x)), scalar_like(2 * stddev, x)), dtype);
    }
    case Kind::Uniform:
      return random::uniform(key, shape, dtype, low, high);
    case Kind::Zeros:
      return tessera::zeros(shape, dtype);
    case Kind::Ones:
      return tessera::ones(shape, dtype);
    case Kind::Constant:
      return full(shape, value, dtype);
  }
  fail<ValueError>("Initializer: unknown kind {}", static_cast<int>(kind));
}

std::string Initializer::to_string() const {
  switch (kind) {
    case Kind::Normal:
      return fmt::format("normal({:g})", stddev);
    case Kind::TruncatedNormal:
      return fmt::format("truncated_normal({:g})", stddev);
    case Kind::Uniform:
      return fmt::format("uniform({:g}, {:g})", low, high);
    case Kind::Zeros:
      return "zeros";
    case Kind::Ones:
      return "ones";
    case Kind::Constant:
      return fmt::format("constant({:g})", value);
  }
  return "?";
}

const char* to_string(ParamKind kind) {
  switch (kind) {
    case ParamKind::Weight:
      return "weight";
    case ParamKind::Bias:
      return "bias";
    case ParamKind::Norm:
      return "norm";
    case ParamKind::Embedding:
      return "embedding";
  }
  return "?";
}

ParamScope::ParamScope(uint64_t seed, DType dtype)
    : seed_(seed), dtype_(dtype), specs_(std::make_shared<ParamSpecs>()) {}

ParamScope ParamScope::specs_only(DType dtype) {
  ParamScope scope(0, dtype);
  scope.specs_only_ = true;
  return scope;
}

ParamScope ParamScope::child(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    fail<ValueError>("ParamScope::child: name '{}' must be non-empty and contain no '.' (under '{}')", name, path_);
  return ParamScope(seed_, dtype_, path_.empty() ? name : path_ + "." + name, specs_, specs_only_, materialize_);
}

ParamScope ParamScope::only(std::function<bool(const std::string& path)> materialize) const {
  return ParamScope(seed_, dtype_, path_, specs_, specs_only_,
                    std::make_shared<const std::function<bool(const std::string&)>>(std::move(materialize)));
}

Array ParamScope::param(const std::string& name, ParamInfo info) const {
  const std::string full = path_.empty() ? name : path_ + "." + name;
  if (name.empty() || name.find('.') != std::string::npos)
    fail<ValueError>("ParamScope::param: name '{}' must be non-empty and contain no '.' (under '{}')", name, path_);
  if (info.axes.size() != info.shape.size())
    fail<ValueError>("ParamScope::param: '{}' has shape {} but {} logical axis names (one per dimension expected)",
                     full, tessera::to_string(info.shape), info.axes.size());
  if (specs_->contains(full)) fail<ValueError>("ParamScope::param: parameter '{}' declared twice", full);
  info.dtype = dtype_;
  const bool placeholder = specs_only_ || (materialize_ && !(*materialize_)(full));
  Array value = placeholder ? Array::placeholder(info.shape, dtype_)
                            : info.init(param_key(seed_, full), info.shape, dtype_).eval();
  specs_->emplace(full, std::move(info));
  return value;
}

Array param_key(uint64_t seed, const std::string& path) { return key(path_seed(seed, path)); }

int64_t parameter_count(const ParamSpecs& specs) {
  int64_t count = 0;
  for (const auto& [path, info] : specs) count += numel(info.shape);
  return count;
}

}  // namespace tessera::nn
