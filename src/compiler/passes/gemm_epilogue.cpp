// GemmEpiloguePass (see the header): pattern matching on one matmul at a time and the
// rewrite into a MatmulEpilogue node.
#include "tessera/compiler/passes/gemm_epilogue.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tessera/compiler/passes/remat.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/matmul_epilogue.h"
#include "tessera/ir/primitives/quantized.h"

namespace tessera::compiler {
namespace {

struct Match {
  int matmul = -1, add = -1, activation = -1;  // node indices (-1: absent)
  int activation_grad = -1;                    // gelu_tanh_grad(x, matmul): the backward's form
  ValueId bias = kNoValue;                     // read by the fused node
  int bias_broadcast = -1;                     // a broadcast_to read through
  MatmulEpilogue::Options options;
};

bool is_returned(const Graph& g, ValueId v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

// [N] or [1, ..., 1, N] of at most `rank` dims.
bool is_row_vector(const Shape& shape, int64_t n, size_t rank) {
  if (shape.empty() || shape.size() > rank || shape.back() != n) return false;
  return std::all_of(shape.begin(), shape.end() - 1, [](int64_t d) { return d == 1; });
}

class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g), users_(g.users()) {}

  std::optional<Match> match(int index) const {
    const Node& mm = g_.nodes[index];
    const auto* matmul = dynamic_cast<const Matmul*>(mm.primitive.get());
    // An int8 (AQT) GEMM fuses too when it rounds both operands to nearest (a forward
    // product: its key input, if any, is then unused).
    const auto* int8 = dynamic_cast<const QuantizedMatmul*>(mm.primitive.get());
    if (int8 && (int8->config().stochastic_a || int8->config().stochastic_b)) int8 = nullptr;
    if (mm.dead || (!matmul && !int8) || mm.outputs.size() != 1 || !fusable_after_remat(mm)) return std::nullopt;
    Match m;
    m.matmul = index;
    m.options.trans_a = matmul ? matmul->trans_a() : int8->config().trans_a;
    m.options.trans_b = matmul ? matmul->trans_b() : int8->config().trans_b;
    m.options.int8 = int8 != nullptr;
    const TensorType out = g_.type(mm.outputs[0]);
    ValueId v = mm.outputs[0];
    if (!m.options.int8 && match_activation_grad(m, v, out)) return m;
    if (!match_bias(m, v, out)) m.options.bias = false;
    for (int u : users_[v]) {
      const Node& node = g_.nodes[u];
      const auto* unary = dynamic_cast<const Unary*>(node.primitive.get());
      if (!unary || !MatmulEpilogue::supports_activation(unary->kind()) || !fusable_with(node, mm)) continue;
      m.activation = u;
      m.options.activation = unary->kind();
      m.options.pre_activation = users_[v].size() > 1 || is_returned(g_, v);
      break;
    }
    if (!m.options.bias && !m.options.activation) return std::nullopt;
    return m;
  }

 private:
  bool fusable_with(const Node& node, const Node& mm) const {
    return !node.dead && fusable_after_remat(node) && node.remat_region == mm.remat_region && node.outputs.size() == 1;
  }

  // The product read only by gelu_tanh_grad(x, product) (an MLP's backward: the
  // gradient of the activation's input x from that of its output).
  bool match_activation_grad(Match& m, ValueId v, const TensorType& out) const {
    if (users_[v].size() != 1 || is_returned(g_, v)) return false;
    const int u = users_[v][0];
    const Node& node = g_.nodes[u];
    const auto* binary = dynamic_cast<const Binary*>(node.primitive.get());
    if (!binary || binary->kind() != BinaryKind::GeluTanhGrad || node.inputs.size() != 2 || node.inputs[1] != v ||
        node.inputs[0] == v || !fusable_with(node, g_.nodes[m.matmul]) || g_.type(node.inputs[0]) != out ||
        g_.type(node.outputs[0]) != out)
      return false;
    m.activation_grad = u;
    m.options.bias = false;
    m.options.activation_grad = UnaryKind::GeluTanh;
    return true;
  }

  // On success v becomes the add's output.
  bool match_bias(Match& m, ValueId& v, const TensorType& out) const {
    if (users_[v].size() != 1 || is_returned(g_, v)) return false;
    const int a = users_[v][0];
    const Node& add = g_.nodes[a];
    const auto* binary = dynamic_cast<const Binary*>(add.primitive.get());
    if (!binary || binary->kind() != BinaryKind::Add || !fusable_with(add, g_.nodes[m.matmul]) ||
        add.inputs.size() != 2 || g_.type(add.outputs[0]) != out)
      return false;
    const bool bias_first = add.inputs[1] == v;
    ValueId bias = bias_first ? add.inputs[0] : add.inputs[1];
    if (bias == v || g_.type(bias).dtype != out.dtype) return false;
    const Node* producer = g_.producer(bias);
    if (producer && dynamic_cast<const BroadcastTo*>(producer->primitive.get()) && producer->inputs.size() == 1) {
      m.bias_broadcast = static_cast<int>(producer - g_.nodes.data());
      bias = producer->inputs[0];
    }
    if (!is_row_vector(g_.type(bias).shape, out.shape.back(), out.shape.size())) return false;
    m.add = a;
    m.bias = bias;
    m.options.bias_first = bias_first;
    v = add.outputs[0];
    return true;
  }

  const Graph& g_;
  std::vector<std::vector<int>> users_;
};

// A match's nodes named by their first outputs: value ids survive the rewrites of
// other matches in the same round (which insert nodes and so move indices).
struct Pending {
  Match match;
  ValueId matmul = kNoValue, add = kNoValue, activation = kNoValue, bias_broadcast = kNoValue,
          activation_grad = kNoValue;
};

ValueId first_output(const Graph& g, int node) { return node >= 0 ? g.nodes[node].outputs[0] : kNoValue; }
int node_of(const Graph& g, ValueId v) {
  return v != kNoValue && g.value(v).kind == ValueKind::NodeOutput ? g.value(v).node : -1;
}

bool is_read(const Graph& g, ValueId v) {
  for (const Node& node : g.nodes)
    if (!node.dead && std::find(node.inputs.begin(), node.inputs.end(), v) != node.inputs.end()) return true;
  return false;
}

// matmul, gelu_tanh_grad(x, matmul) -> matmul_epilogue(a, b, x) where the gradient was:
// x may be made after the matmul (a forward value recomputed by remat).
void rewrite_activation_grad(Graph& g, const Pending& pending) {
  const int mm = node_of(g, pending.matmul), grad = node_of(g, pending.activation_grad);
  // Read now: an earlier rewrite of this round may have replaced x (the forward's fused node).
  const std::vector<ValueId> inputs = {g.nodes[mm].inputs[0], g.nodes[mm].inputs[1], g.nodes[grad].inputs[0]};
  const ValueId y = g.nodes[grad].outputs[0];
  const int region = g.nodes[mm].remat_region;
  const std::string remat_name = g.nodes[mm].remat_name;
  auto outs = g.insert_node(grad + 1, std::make_shared<MatmulEpilogue>(pending.match.options), inputs, {g.type(y)});
  g.nodes[grad + 1].remat_region = region;
  g.nodes[grad + 1].remat_name = remat_name;
  g.erase_node(mm);  // before grad: unshifted
  g.erase_node(grad);
  g.replace_uses(y, outs[0]);
}

void rewrite(Graph& g, const Pending& pending) {
  if (pending.activation_grad != kNoValue) {
    rewrite_activation_grad(g, pending);
    return;
  }
  Match m = pending.match;
  m.matmul = node_of(g, pending.matmul);
  m.add = node_of(g, pending.add);
  m.activation = node_of(g, pending.activation);
  m.bias_broadcast = node_of(g, pending.bias_broadcast);
  const Node& mm = g.nodes[m.matmul];
  std::vector<ValueId> inputs(mm.inputs.begin(), mm.inputs.begin() + 2);  // not an int8 GEMM's key
  if (m.options.bias) inputs.push_back(m.bias);
  const int region = mm.remat_region;
  const std::string remat_name = mm.remat_name;    // a clone's stays one (remat.h)
  const int last = m.add >= 0 ? m.add : m.matmul;  // producer of the pre-activation value
  const ValueId pre = g.nodes[last].outputs[0];
  const ValueId y = m.activation >= 0 ? g.nodes[m.activation].outputs[0] : pre;
  std::vector<TensorType> types = {g.type(y)};
  if (m.options.pre_activation) types.push_back(g.type(pre));
  // Every input is defined before `last`, and every reader of pre or y comes after it.
  auto outs = g.insert_node(last + 1, std::make_shared<MatmulEpilogue>(m.options), inputs, types);
  g.nodes[last + 1].remat_region = region;
  g.nodes[last + 1].remat_name = remat_name;
  auto shifted = [&](int index) { return index > last ? index + 1 : index; };
  g.erase_node(shifted(m.matmul));
  if (m.add >= 0) g.erase_node(shifted(m.add));
  if (m.activation >= 0) g.erase_node(shifted(m.activation));
  g.replace_uses(y, outs[0]);
  if (m.options.pre_activation) g.replace_uses(pre, outs[1]);
  if (m.bias_broadcast >= 0) {
    const int b = shifted(m.bias_broadcast);
    const ValueId v = g.nodes[b].outputs[0];
    if (!is_read(g, v) && !is_returned(g, v)) g.erase_node(b);
  }
}

}  // namespace

void GemmEpiloguePass::run(Graph& graph) {
  // Rounds: one scan finds every match that shares no node with an earlier match of
  // the round (nor reads a value one of them replaces), all are rewritten, then the
  // graph is compacted once. A match left out waits for the next round's fresh scan,
  // so the result is the one-match-at-a-time result, in a few rounds instead of one
  // graph-wide rewrite and compaction per matmul.
  for (;;) {
    std::vector<Pending> round;
    {
      Matcher matcher(graph);
      std::vector<char> claimed(graph.nodes.size(), 0);
      for (int n = 0; n < static_cast<int>(graph.nodes.size()); ++n) {
        std::optional<Match> found = matcher.match(n);
        if (!found) continue;
        const Match& m = *found;
        const int bias_producer = m.options.bias ? node_of(graph, m.bias) : -1;
        const int touched[] = {m.matmul, m.add, m.activation, m.bias_broadcast, bias_producer, m.activation_grad};
        if (std::any_of(std::begin(touched), std::end(touched), [&](int t) { return t >= 0 && claimed[t]; })) continue;
        for (int t : touched)
          if (t >= 0) claimed[t] = 1;
        round.push_back({m, first_output(graph, m.matmul), first_output(graph, m.add),
                         first_output(graph, m.activation), first_output(graph, m.bias_broadcast),
                         first_output(graph, m.activation_grad)});
      }
    }
    if (round.empty()) break;
    for (const Pending& pending : round) rewrite(graph, pending);
    graph.compact();
  }
}

}  // namespace tessera::compiler
