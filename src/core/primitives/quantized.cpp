// quantized_matmul: attributes, the op builder, vjp and cost (ir/primitives/quantized.h).
#include "tessera/ir/primitives/quantized.h"

#include <fmt/format.h>

#include "core/primitives/rule_utils.h"
#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/linalg.h"

namespace tessera {

std::string QuantizedMatmul::attributes() const {
  const QuantizedMatmulConfig& c = config_;
  return fmt::format("trans_a={}, trans_b={}, stochastic_a={}, stochastic_b={}, int8_backward={}, salt={}", c.trans_a,
                     c.trans_b, c.stochastic_a, c.stochastic_b, c.int8_backward, c.salt);
}

uint64_t QuantizedMatmul::rounding_seed(uint32_t key0, uint32_t key1, int operand) const {
  // splitmix64 of the key and (salt, operand): distinct sites and operands draw
  // unrelated noise from one key.
  uint64_t z = ((static_cast<uint64_t>(key1) << 32) | key0) ^
               ((static_cast<uint64_t>(config_.salt) << 1 | static_cast<uint64_t>(operand)) * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Array quantized_matmul_op(const Array& a, const Array& b, const QuantizedMatmulConfig& config, const Array* key) {
  if (a.ndim() < 2 || b.ndim() != 2 || (config.trans_a && a.ndim() != 2))
    fail<ShapeError>(
        "quantized_matmul: operands {} and {} (expected a [..., m, k] (or [k, m] when transposed) and b of rank 2)",
        to_string(a.shape()), to_string(b.shape()));
  if (a.dtype() != b.dtype())
    fail<DTypeError>("quantized_matmul: operand dtypes differ ({} and {})", name(a.dtype()), name(b.dtype()));
  if (a.dtype() != DType::Float32 && a.dtype() != DType::BFloat16)
    fail<DTypeError>("quantized_matmul: dtype {} (expected float32 or bfloat16)", name(a.dtype()));
  const int64_t ka = a.shape(config.trans_a ? 0 : -1);
  const int64_t kb = b.shape(config.trans_b ? 1 : 0), n = b.shape(config.trans_b ? 0 : 1);
  if (ka != kb)
    fail<ShapeError>("quantized_matmul: contracting dimensions differ: {} has K={} but {} has K={} (expected equal)",
                     to_string(a.shape()), ka, to_string(b.shape()), kb);
  std::vector<Array> inputs = {a, b};
  if (key) {
    if (key->dtype() != DType::UInt32 || key->shape() != Shape{2})
      fail<ValueError>("quantized_matmul: the key is {} {} (expected a random key, uint32 [2])", name(key->dtype()),
                       to_string(key->shape()));
    inputs.push_back(*key);
  }
  Shape out = a.shape();  // a's rows (all its leading dims), then n
  if (config.trans_a) out[0] = a.shape(1);
  out.back() = n;
  return Array::make(out, a.dtype(), std::make_shared<QuantizedMatmul>(config), inputs);
}

std::vector<Array> QuantizedMatmul::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                        const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& a = primals[0];
  const Array& b = primals[1];
  const Array& g = cotangents[0];
  const Array* key = primals.size() > 2 ? &primals[2] : nullptr;
  const bool ta = config_.trans_a, tb = config_.trans_b;
  // Each backward GEMM: the cotangent operand rounds stochastically, the other to nearest.
  auto gemm = [&](const Array& x, const Array& y, bool tx, bool ty, bool x_is_cotangent) {
    if (!config_.int8_backward) return matmul_op(x, y, tx, ty);
    QuantizedMatmulConfig c = config_;
    c.trans_a = tx;
    c.trans_b = ty;
    c.stochastic_a = x_is_cotangent && key != nullptr;
    c.stochastic_b = !x_is_cotangent && key != nullptr;
    c.salt = config_.salt * 2654435761u + (x_is_cotangent ? 1u : 2u);
    return quantized_matmul_op(x, y, c, key);
  };
  // dB contracts over all of A's rows: A and g as matrices (a transposed operand is 2-D).
  const Array a2 = a.ndim() > 2 ? reshape(a, {-1, a.shape(-1)}) : a;
  const Array g2 = g.ndim() > 2 ? reshape(g, {-1, g.shape(-1)}) : g;
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0) {
      // C = op(A) op(B): d op(A) = g op(B)^T, transposed back when A is stored transposed.
      result.push_back(ta ? gemm(b, g, tb, true, false) : gemm(g, b, false, !tb, true));
    } else if (arg == 1) {
      result.push_back(tb ? gemm(g2, a2, true, ta, true) : gemm(a2, g2, !ta, false, false));
    } else {
      result.push_back(zeros_like(primals[static_cast<size_t>(arg)]));  // the key: not differentiable
    }
  }
  return result;
}

// A batch of row blocks times a shared matrix is one GEMM over all the rows (each row
// quantizes on its own, so the result is the per-example products bitwise); any other
// batching loops over the examples.
std::pair<std::vector<Array>, std::vector<int>> QuantizedMatmul::vmap(const std::vector<Array>& inputs,
                                                                      const std::vector<int>& axes) {
  const bool only_a = axes[0] >= 0 && axes[1] < 0 && (axes.size() < 3 || axes[2] < 0);
  if (only_a && !config_.trans_a) {
    const Array a = rules::batch_to_front(inputs[0], axes[0]);
    return {{quantized_matmul_op(a, inputs[1], config_, inputs.size() > 2 ? &inputs[2] : nullptr)}, {0}};
  }
  const QuantizedMatmulConfig config = config_;
  return rules::loop_vmap(
      [config](const std::vector<Array>& xs) {
        return std::vector<Array>{quantized_matmul_op(xs[0], xs[1], config, xs.size() > 2 ? &xs[2] : nullptr)};
      },
      inputs, axes, "quantized_matmul");
}

Cost QuantizedMatmul::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  const int64_t k = inputs[0].shape(config_.trans_a ? 0 : -1);
  c.flops = 2.0 * static_cast<double>(outputs[0].size()) * static_cast<double>(k);
  return c;
}

}  // namespace tessera
