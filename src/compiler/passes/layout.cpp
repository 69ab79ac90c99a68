#include "tessera/compiler/passes/layout.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "compiler/passes/node_rewriter.h"
#include "tessera/compiler/passes/dce.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/linalg.h"

namespace tessera::compiler {

namespace {

// Perm that exchanges the last two axes and keeps the rest: the transpose a matmul
// flag applies.
bool swaps_last_two(const std::vector<int>& perm) {
  const int rank = static_cast<int>(perm.size());
  if (rank < 2) return false;
  for (int i = 0; i < rank - 2; ++i) {
    if (perm[static_cast<size_t>(i)] != i) return false;
  }
  return perm[static_cast<size_t>(rank - 2)] == rank - 1 && perm[static_cast<size_t>(rank - 1)] == rank - 2;
}

bool all_equal(const std::vector<int64_t>& v, int64_t x) {
  return std::all_of(v.begin(), v.end(), [x](int64_t e) { return e == x; });
}

// Elements a normalized slice selects along one axis.
int64_t slice_count(int64_t start, int64_t stop, int64_t step) {
  return stop <= start ? 0 : (stop - start + step - 1) / step;
}

class LayoutSimplifier : public NodeRewriter {
 public:
  LayoutSimplifier(Graph& graph, bool fold_matmul_transposes)
      : NodeRewriter(graph), fold_matmul_transposes_(fold_matmul_transposes) {}

 private:
  // The live, untagged node producing v as a P (nullptr otherwise). Tagged
  // producers are left alone: remat reads their tags.
  // Reads of v by live nodes (each operand counts) and by the graph's outputs.
  int use_count(ValueId v) const {
    int count = static_cast<int>(std::count(g_.outputs.begin(), g_.outputs.end(), v));
    for (const Node& nd : g_.nodes) {
      if (!nd.dead) count += static_cast<int>(std::count(nd.inputs.begin(), nd.inputs.end(), v));
    }
    return count;
  }

  bool rewrite(int n) override {
    const Primitive* p = node(n).primitive.get();
    if (const auto* b = dynamic_cast<const Binary*>(p)) return b->kind() == BinaryKind::Add && pads_to_concat(n);
    if (const auto* m = dynamic_cast<const Matmul*>(p)) return fold_matmul_transposes_ && matmul_operands(n, *m);
    if (const auto* t = dynamic_cast<const Transpose*>(p)) {
      return (fold_matmul_transposes_ && transpose_of_matmul(n, *t)) || unit_transpose(n, *t);
    }
    if (const auto* s = dynamic_cast<const Slice*>(p)) return slice(n, *s);
    if (dynamic_cast<const SlicePad*>(p)) return forward(n, node(n).inputs[0]);  // only when it is the identity
    return false;
  }

  // The summands of v through single-use adds of v's exact type (no broadcasting).
  void summands(ValueId v, std::vector<ValueId>& out) {
    const Binary* b = producer_as<Binary>(v);
    if (b != nullptr && b->kind() == BinaryKind::Add && use_count(v) == 1) {
      const Node* add = g_.producer(v);
      const ValueId lhs = add->inputs[0], rhs = add->inputs[1];
      if (g_.type(lhs) == g_.type(v) && g_.type(rhs) == g_.type(v)) {
        summands(lhs, out);
        summands(rhs, out);
        return;
      }
    }
    out.push_back(v);
  }

  // add(slice_pad(a), slice_pad(b), ...) -> concatenate(a, b, ...) when the pads
  // tile one axis exactly (each piece is written once, the rest of the sum is 0).
  bool pads_to_concat(int n) {
    if (!node(n).remat_name.empty()) return false;
    const ValueId out = node(n).outputs[0];
    const TensorType& type = g_.type(out);
    const int rank = static_cast<int>(type.shape.size());
    if (rank == 0 || numel(type.shape) == 0) return false;
    if (g_.type(node(n).inputs[0]) != type || g_.type(node(n).inputs[1]) != type) return false;
    std::vector<ValueId> terms;
    summands(node(n).inputs[0], terms);
    summands(node(n).inputs[1], terms);

    struct Piece {
      ValueId value;
      int64_t start, length;
    };
    std::vector<Piece> pieces;
    int axis = -1;
    for (ValueId term : terms) {
      const SlicePad* pad = producer_as<SlicePad>(term);
      if (pad == nullptr || pad->shape() != type.shape || !all_equal(pad->step(), 1)) return false;
      const ValueId piece = g_.producer(term)->inputs[0];
      const Shape& piece_shape = g_.type(piece).shape;
      int piece_axis = -1;
      for (int d = 0; d < rank; ++d) {
        const auto i = static_cast<size_t>(d);
        if (pad->start()[i] == 0 && piece_shape[i] == type.shape[i]) continue;
        if (piece_axis >= 0) return false;  // cut along two axes
        piece_axis = d;
      }
      if (piece_axis < 0) return false;  // covers everything, so it overlaps the others
      if (axis >= 0 && piece_axis != axis) return false;
      axis = piece_axis;
      const auto a = static_cast<size_t>(axis);
      pieces.push_back({piece, pad->start()[a], piece_shape[a]});
    }
    std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& x, const Piece& y) { return x.start < y.start; });
    int64_t covered = 0;
    for (const Piece& piece : pieces) {
      if (piece.start != covered) return false;  // a gap or an overlap
      covered += piece.length;
    }
    if (covered != type.shape[static_cast<size_t>(axis)]) return false;

    std::vector<ValueId> inputs;
    for (const Piece& piece : pieces) inputs.push_back(piece.value);
    const int region = node(n).remat_region;
    const ValueId concat = g_.insert_node(n, std::make_shared<Concatenate>(axis), inputs, {type})[0];
    node(n).remat_region = region;
    g_.replace_uses(out, concat);
    g_.erase_node(n + 1);  // the add moved down one place
    return true;
  }

  // matmul(transpose(x, swap last two), y) -> matmul(x, y) with the flag flipped.
  bool matmul_operands(int n, const Matmul& matmul) {
    bool trans[2] = {matmul.trans_a(), matmul.trans_b()};
    bool changed = false;
    for (size_t i = 0; i < 2; ++i) {
      const ValueId operand = node(n).inputs[i];
      const Transpose* t = producer_as<Transpose>(operand);
      if (t == nullptr || !swaps_last_two(t->perm())) continue;
      node(n).inputs[i] = g_.producer(operand)->inputs[0];
      trans[i] = !trans[i];
      changed = true;
    }
    if (changed) node(n).primitive = std::make_shared<Matmul>(trans[0], trans[1]);
    return changed;
  }

  // transpose(matmul(a, b), swap last two) -> matmul(b, a) with both flags flipped:
  // (op(A) op(B))^T = op(B)^T op(A)^T. The batch dims are the same either way.
  bool transpose_of_matmul(int n, const Transpose& transpose) {
    if (!node(n).remat_name.empty() || !swaps_last_two(transpose.perm())) return false;
    const ValueId product = node(n).inputs[0];
    const Matmul* matmul = producer_as<Matmul>(product);
    if (matmul == nullptr || use_count(product) != 1) return false;
    const Node* producer = g_.producer(product);
    if (producer->remat_region != node(n).remat_region) return false;
    const ValueId a = producer->inputs[0], b = producer->inputs[1];
    node(n).primitive = std::make_shared<Matmul>(!matmul->trans_b(), !matmul->trans_a());
    node(n).inputs = {b, a};
    return true;
  }

  // A transpose that keeps the order of the axes of size > 1 moves no element
  // relative to the others: it is a reshape (which shares the buffer).
  bool unit_transpose(int n, const Transpose& transpose) {
    if (!node(n).remat_name.empty()) return false;
    const Shape& in = g_.type(node(n).inputs[0]).shape;
    int64_t previous = -1;
    for (int axis : transpose.perm()) {
      if (in[static_cast<size_t>(axis)] == 1) continue;
      if (axis < previous) return false;
      previous = axis;
    }
    if (forward(n, node(n).inputs[0])) return true;
    node(n).primitive = std::make_shared<Reshape>(g_.type(node(n).outputs[0]).shape);
    return true;
  }

  bool slice(int n, const Slice& s) {
    const ValueId x = node(n).inputs[0];
    if (forward(n, x)) return true;  // the full slice
    if (const SlicePad* pad = producer_as<SlicePad>(x)) {
      const ValueId padded = g_.producer(x)->inputs[0];
      if (s.start() == pad->start() && s.step() == pad->step() && forward(n, padded)) return true;
    }
    if (const Slice* inner = producer_as<Slice>(x)) return slice_of_slice(n, s, *inner);
    if (const Concatenate* concat = producer_as<Concatenate>(x)) return slice_of_concat(n, s, concat->axis());
    return false;
  }

  // Output index i reads the inner slice at s0 + i*t0, which reads x at
  // s1 + (s0 + i*t0)*t1.
  bool slice_of_slice(int n, const Slice& outer, const Slice& inner) {
    const size_t rank = outer.start().size();
    std::vector<int64_t> start(rank), stop(rank), step(rank);
    for (size_t d = 0; d < rank; ++d) {
      const int64_t count = slice_count(outer.start()[d], outer.stop()[d], outer.step()[d]);
      start[d] = inner.start()[d] + outer.start()[d] * inner.step()[d];
      step[d] = outer.step()[d] * inner.step()[d];
      stop[d] = count == 0 ? start[d] : start[d] + (count - 1) * step[d] + 1;
    }
    node(n).inputs[0] = g_.producer(node(n).inputs[0])->inputs[0];
    node(n).primitive = std::make_shared<Slice>(std::move(start), std::move(stop), std::move(step));
    return true;
  }

  // A slice that reads within one piece of a concatenation reads that piece.
  bool slice_of_concat(int n, const Slice& s, int axis) {
    const auto a = static_cast<size_t>(axis);
    const int64_t count = slice_count(s.start()[a], s.stop()[a], s.step()[a]);
    if (count == 0) return false;
    const int64_t first = s.start()[a], last = first + (count - 1) * s.step()[a];
    int64_t offset = 0;
    for (ValueId piece : g_.producer(node(n).inputs[0])->inputs) {
      const int64_t length = g_.type(piece).shape[a];
      if (first >= offset && last < offset + length) {
        std::vector<int64_t> start = s.start(), stop = s.stop();
        start[a] = first - offset;
        stop[a] = last - offset + 1;
        node(n).inputs[0] = piece;
        node(n).primitive = std::make_shared<Slice>(std::move(start), std::move(stop), s.step());
        return true;
      }
      offset += length;
    }
    return false;
  }

  bool fold_matmul_transposes_;
};

}  // namespace

void LayoutSimplification::run(Graph& graph) {
  LayoutSimplifier(graph, fold_matmul_transposes_).run_to_fixed_point();
  DeadCodeElimination().run(graph);
}

}  // namespace tessera::compiler
