#include "tessera/compiler/passes/simplify.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "compiler/passes/node_rewriter.h"
#include "tessera/base/error.h"
#include "tessera/compiler/passes/dce.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera::compiler {

namespace {

template <typename P>
const P* producer_as(const Graph& graph, ValueId v) {
  const Node* node = graph.producer(v);
  return node && !node->dead ? dynamic_cast<const P*>(node->primitive.get()) : nullptr;
}

// The common value of a constant whose elements are all equal (bitwise), looking
// through broadcast_to; nullopt for anything else.
std::optional<double> splat_value(const Graph& graph, ValueId v) {
  const Value& value = graph.value(v);
  if (value.kind == ValueKind::Constant) {
    const int64_t n = numel(value.type.shape);
    if (n == 0) return std::nullopt;
    const size_t item = itemsize(value.type.dtype);
    const auto* bytes = static_cast<const unsigned char*>(value.constant.raw_data());
    for (int64_t i = 1; i < n; ++i) {
      if (std::memcmp(bytes, bytes + static_cast<size_t>(i) * item, item) != 0) return std::nullopt;
    }
    return load_as_double(value.type.dtype, bytes, 0);
  }
  if (producer_as<BroadcastTo>(graph, v)) return splat_value(graph, graph.producer(v)->inputs[0]);
  return std::nullopt;
}

bool is_splat(const Graph& graph, ValueId v, double expected) {
  std::optional<double> s = splat_value(graph, v);
  return s && *s == expected;
}

class Simplifier : public NodeRewriter {
 public:
  explicit Simplifier(Graph& graph) : NodeRewriter(graph) {}

 private:
  // Replaces node n's single output by x and erases n. Tagged nodes stay: remat
  // reads their tags.
  bool rewrite(int n) override {
    const Primitive* p = node(n).primitive.get();
    if (const auto* b = dynamic_cast<const Binary*>(p)) return binary_identity(n, b->kind()) || fold_broadcasts(n);
    if (dynamic_cast<const Where*>(p)) return fold_broadcasts(n);
    if (const auto* u = dynamic_cast<const Unary*>(p)) return double_negation(n, u->kind());
    if (const auto* t = dynamic_cast<const Transpose*>(p)) return transpose(n, *t);
    if (dynamic_cast<const Reshape*>(p)) return reshape(n);
    if (dynamic_cast<const BroadcastTo*>(p) || dynamic_cast<const Cast*>(p)) return type_preserving(n);
    if (dynamic_cast<const AdamW*>(p)) return widened_gradient(n);
    return false;
  }

  // adamw_update(p, convert(g16, float32), ...) -> adamw_update(p, g16, ...): the update
  // widens a bfloat16/float16 gradient itself (exactly, as the convert), so the float32
  // copy is neither written nor read. The convert stays while others read it (the
  // gradient norm's square, which fusion then folds into its reduction).
  bool widened_gradient(int n) {
    const ValueId grad = node(n).inputs[1];
    if (!producer_as<Cast>(grad, /*untagged=*/false)) return false;
    const ValueId source = g_.producer(grad)->inputs[0];
    const DType param = g_.type(node(n).inputs[0]).dtype;
    if (g_.type(source).dtype == param || !AdamW::accepts_grad(param, g_.type(source).dtype)) return false;
    node(n).inputs[1] = source;
    return true;
  }

  bool binary_identity(int n, BinaryKind kind) {
    const ValueId a = node(n).inputs[0], b = node(n).inputs[1];
    switch (kind) {
      case BinaryKind::Mul:
        return (is_splat(g_, b, 1) && forward(n, a)) || (is_splat(g_, a, 1) && forward(n, b));
      case BinaryKind::Add:
        return (is_splat(g_, b, 0) && forward(n, a)) || (is_splat(g_, a, 0) && forward(n, b));
      case BinaryKind::Sub:
        return is_splat(g_, b, 0) && forward(n, a);
      case BinaryKind::Div:
        return is_splat(g_, b, 1) && forward(n, a);
      default:
        return false;
    }
  }

  // op(..., broadcast_to(a), ...) -> op(..., a, ...) when numpy broadcasting of the
  // operands still gives the output shape.
  bool fold_broadcasts(int n) {
    bool changed = false;
    const Shape& out_shape = g_.type(node(n).outputs[0]).shape;
    for (size_t i = 0; i < node(n).inputs.size(); ++i) {
      if (!producer_as<BroadcastTo>(node(n).inputs[i], /*untagged=*/false)) continue;
      const ValueId source = g_.producer(node(n).inputs[i])->inputs[0];
      Shape shape = g_.type(source).shape;
      for (size_t j = 0; j < node(n).inputs.size(); ++j) {
        if (j != i) shape = broadcast_shapes(shape, g_.type(node(n).inputs[j]).shape, "simplify");
      }
      if (shape != out_shape) continue;
      node(n).inputs[i] = source;
      changed = true;
    }
    return changed;
  }

  bool double_negation(int n, UnaryKind kind) {
    if (kind != UnaryKind::Neg) return false;
    const auto* inner = producer_as<Unary>(node(n).inputs[0], /*untagged=*/false);
    if (!inner || inner->kind() != UnaryKind::Neg) return false;
    return forward(n, g_.producer(node(n).inputs[0])->inputs[0]);
  }

  // transpose(transpose(x, p), q)[i] reads x's axis p[q[i]].
  bool transpose(int n, const Transpose& outer) {
    std::vector<int> perm = outer.perm();
    ValueId source = node(n).inputs[0];
    bool changed = false;
    if (const auto* inner = producer_as<Transpose>(source, /*untagged=*/false)) {
      std::vector<int> first = inner->perm();
      std::vector<int> composed(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) composed[i] = first[static_cast<size_t>(perm[i])];
      perm = composed;
      source = g_.producer(source)->inputs[0];
      node(n).primitive = std::make_shared<Transpose>(perm);
      node(n).inputs[0] = source;
      changed = true;
    }
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int>(i);
    return (identity && forward(n, source)) || changed;
  }

  bool reshape(int n) {
    bool changed = false;
    if (producer_as<Reshape>(node(n).inputs[0], /*untagged=*/false)) {
      node(n).inputs[0] = g_.producer(node(n).inputs[0])->inputs[0];
      changed = true;
    }
    return type_preserving(n) || changed;
  }

  // reshape / broadcast_to / convert to the input's own type is the identity.
  bool type_preserving(int n) {
    const ValueId x = node(n).inputs[0];
    return g_.type(x) == g_.type(node(n).outputs[0]) && forward(n, x);
  }
};

}  // namespace

void AlgebraicSimplification::run(Graph& graph) {
  Simplifier(graph).run_to_fixed_point();
  DeadCodeElimination().run(graph);
}

}  // namespace tessera::compiler
