// quantized_matmul: an int8 GEMM with dynamic symmetric quantization, AQT-style
// (backend/cpu/kernels/matmul_int8.h has the exact rule): every row of op(A) and every
// column of op(B) is scaled into [-127, 127] over the contraction axis, the int8
// products accumulate in int32 and the result is dequantized in the epilogue. A is
// [..., m, k] (its leading dims are more rows: each row quantizes on its own) or [k, m]
// when transposed, B is rank 2; both share a floating dtype (float32 or bfloat16). An
// optional third input, a random key (uint32 [2]), seeds the stochastic rounding of
// gradients.
//
// Its vjp is two more quantized_matmuls when `int8_backward` (AQT's "forward and both
// backward GEMMs in int8"): the cotangent operand rounds stochastically (seeded by the
// key and `salt`, nearest without a key), the other to nearest. Otherwise the backward
// GEMMs are ordinary matmuls of the unquantized operands (the straight-through
// estimator: the forward's rounding is treated as the identity).
#pragma once

#include <cstdint>

#include "tessera/ir/primitive.h"

namespace tessera {

struct QuantizedMatmulConfig {
  bool trans_a = false, trans_b = false;
  bool stochastic_a = false, stochastic_b = false;  // round this operand stochastically
  bool int8_backward = true;
  uint32_t salt = 0;  // tells apart the rounding noise of different matmul sites
};

class QuantizedMatmul : public Primitive {
 public:
  explicit QuantizedMatmul(QuantizedMatmulConfig config) : config_(config) {}
  const QuantizedMatmulConfig& config() const { return config_; }
  std::string name() const override { return "quantized_matmul"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COST

  // The 64-bit seed of the stochastic rounding of this op's operand `operand` (0: A,
  // 1: B) from the key's two words.
  uint64_t rounding_seed(uint32_t key0, uint32_t key1, int operand) const;

 private:
  QuantizedMatmulConfig config_;
};

// Builds a quantized_matmul node: a [..., m, k] (or [k, m] when trans_a), b [k, n] (or
// [n, k]) -> [..., m, n]; key an optional uint32 [2] random key. Shape and dtype errors
// name the op.
Array quantized_matmul_op(const Array& a, const Array& b, const QuantizedMatmulConfig& config,
                          const Array* key = nullptr);

}  // namespace tessera
