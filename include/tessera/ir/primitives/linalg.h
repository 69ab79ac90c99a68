// Batched matrix multiply: op(A) @ op(B) with op = optional transpose of the last
// two dims. Operands are [..., M, K] / [..., K, N] with equal batch dims, or rank 2
// (shared by every batch). The transpose flags let the vjp avoid materialized
// transposes.
#pragma once

#include "tessera/ir/primitive.h"

namespace tessera {

class Matmul : public Primitive {
 public:
  Matmul(bool trans_a, bool trans_b) : trans_a_(trans_a), trans_b_(trans_b) {}
  bool trans_a() const { return trans_a_; }
  bool trans_b() const { return trans_b_; }
  std::string name() const override { return "matmul"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COST

 private:
  bool trans_a_, trans_b_;
};

// Builds a Matmul node (shape checks included); used by ops and vjp rules.
Array matmul_op(const Array& a, const Array& b, bool trans_a, bool trans_b);

}  // namespace tessera
