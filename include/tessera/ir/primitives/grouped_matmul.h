// Grouped matrix multiply (a mixture of experts' dropless expert GEMMs): the rows of A
// come sorted by group, and each group's rows multiply their own matrix.
//
//   grouped_matmul(a [G, N, K], w [E, K, M] (or [E, M, K] with trans_w), sizes [G, E]):
//     in batch g, rows [off(g, e), off(g, e) + sizes[g, e]) with off(g, e) = sizes[g, 0] +
//     ... + sizes[g, e-1] multiply w[e] (w[e]^T with trans_w); rows past the last group
//     are zeros. out [G, N, M].
//   grouped_matmul_weight_grad(x [G, N, K], y [G, N, M], sizes [G, E]):
//     out[e] = sum over g of x[g, rows(g, e)]^T y[g, rows(g, e)], [E, K, M] (or with
//     trans_out y^T x, [E, M, K]); the batches added in order g = 0, 1, ...
//
// Both also take a leading shard dim S (expert parallelism: shard s's batches use only
// its own matrices, so S splits over the expert devices with no communication):
//   grouped_matmul(a [S, G, N, K], w [S, E, K, M], sizes [S, G, E]) -> [S, G, N, M],
//   grouped_matmul_weight_grad(x [S, G, N, K], y [S, G, N, M], sizes [S, G, E])
//     -> [S, E, K, M]: each shard s is the rank-3 op on its slices.
//
// sizes are integers (int32 or int64), non-negative, each batch's summing to at most N
// (a ValueError at run time otherwise). Each is the other's vjp, so gradients of any
// order compose. The FLOPs counted are 2 N K M per batch: every row in a group (a
// dropless MoE's rows are all used). With a shard dim, a dispatched group's N rows are
// spread over the S shards, so 2 N K M / S per batch; `row_shards` (the sharding rule
// sets it on a device's program, whose local shard dim is 1) divides the same way: each
// device's buffers hold 1 / row_shards of their rows when the router is balanced.
#pragma once

#include "tessera/ir/primitive.h"

namespace tessera {

class GroupedMatmul : public Primitive {
 public:
  explicit GroupedMatmul(bool trans_w, int64_t row_shards = 1) : trans_w_(trans_w), row_shards_(row_shards) {}
  bool trans_w() const { return trans_w_; }
  int64_t row_shards() const { return row_shards_; }
  std::string name() const override { return "grouped_matmul"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST

 private:
  bool trans_w_;
  int64_t row_shards_;
};

class GroupedMatmulWeightGrad : public Primitive {
 public:
  GroupedMatmulWeightGrad(int64_t groups, bool trans_out, int64_t row_shards = 1)
      : groups_(groups), trans_out_(trans_out), row_shards_(row_shards) {}
  int64_t groups() const { return groups_; }
  bool trans_out() const { return trans_out_; }
  int64_t row_shards() const { return row_shards_; }
  std::string name() const override { return "grouped_matmul_weight_grad"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST

 private:
  int64_t groups_;  // E
  bool trans_out_;
  int64_t row_shards_;
};

// The nodes, with shape and dtype checks (ShapeError / ValueError naming the operands).
Array grouped_matmul_op(const Array& a, const Array& w, const Array& sizes, bool trans_w);
Array grouped_matmul_weight_grad_op(const Array& x, const Array& y, const Array& sizes, bool trans_out);

}  // namespace tessera
