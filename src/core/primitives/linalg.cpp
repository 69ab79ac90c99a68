// vjp and batching rules of Matmul.
#include "tessera/ir/primitives/linalg.h"

#include <fmt/format.h>

#include "core/primitives/rule_utils.h"
#include "tessera/core/ops.h"

namespace tessera {

std::string Matmul::attributes() const {
  if (!trans_a_ && !trans_b_) return {};
  return fmt::format("trans_a={}, trans_b={}", trans_a_, trans_b_);
}

std::vector<Array> Matmul::vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                               const std::vector<int>& argnums, const std::vector<Array>&) {
  const Array& a = primals[0];
  const Array& b = primals[1];
  const Array& g = cotangents[0];
  std::vector<Array> result;
  for (int arg : argnums) {
    if (arg == 0) {
      // C = op(A) op(B): dop(A) = g op(B)^T, transposed back when A is stored transposed.
      if (a.ndim() == 2 && g.ndim() > 2 && b.ndim() == 2 && !trans_a_) {
        Array g2 = reshape(g, {-1, g.shape(-1)});
        result.push_back(rules::sum_to_shape(matmul_op(g2, b, false, !trans_b_), a.shape()));
        continue;
      }
      Array da = trans_a_ ? matmul_op(b, g, trans_b_, true) : matmul_op(g, b, false, !trans_b_);
      result.push_back(rules::sum_to_shape(da, a.shape()));
    } else {
      if (b.ndim() == 2 && a.ndim() > 2 && !trans_a_) {
        // Shared weight: fold the batch into M so dB is one GEMM over all rows.
        Array a2 = reshape(a, {-1, a.shape(-1)});
        Array g2 = reshape(g, {-1, g.shape(-1)});
        result.push_back(trans_b_ ? matmul_op(g2, a2, true, false) : matmul_op(a2, g2, true, false));
        continue;
      }
      Array db = trans_b_ ? matmul_op(g, a, true, trans_a_) : matmul_op(a, g, !trans_a_, false);
      result.push_back(rules::sum_to_shape(db, b.shape()));
    }
  }
  return result;
}

std::pair<std::vector<Array>, std::vector<int>> Matmul::vmap(const std::vector<Array>& inputs,
                                                             const std::vector<int>& axes) {
  int64_t n = rules::batch_size(inputs, axes, "matmul");
  // Per operand: the vmapped batch moved to the front, and its own batch dims.
  std::vector<Array> ops(2);
  std::vector<Shape> inner(2);
  for (int i = 0; i < 2; ++i) {
    ops[i] = axes[i] >= 0 ? rules::batch_to_front(inputs[i], axes[i]) : inputs[i];
    int skip = axes[i] >= 0 ? 1 : 0;
    inner[i] = Shape(ops[i].shape().begin() + skip, ops[i].shape().end() - 2);
  }
  Shape batch = broadcast_shapes(inner[0], inner[1], "matmul");
  batch.insert(batch.begin(), n);
  for (int i = 0; i < 2; ++i) {
    if (axes[i] < 0 && ops[i].ndim() == 2) continue;  // shared matrix: stride-0 batch in the kernel
    Array x = ops[i];
    if (axes[i] >= 0 && inner[i].size() + 1 < batch.size()) {
      Shape s = x.shape();  // [n, inner..., r, c] -> [n, 1..., inner..., r, c]
      s.insert(s.begin() + 1, batch.size() - 1 - inner[i].size(), 1);
      x = reshape(x, s);
    }
    Shape target = batch;
    target.insert(target.end(), x.shape().end() - 2, x.shape().end());
    ops[i] = broadcast_to(x, target);
  }
  return {{matmul_op(ops[0], ops[1], trans_a_, trans_b_)}, {0}};
}

Cost Matmul::cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  Cost c = Primitive::cost(inputs, outputs);
  int64_t k = inputs[0].shape(trans_a_ ? -2 : -1);
  c.flops = 2.0 * static_cast<double>(outputs[0].size()) * static_cast<double>(k);
  return c;
}

}  // namespace tessera
