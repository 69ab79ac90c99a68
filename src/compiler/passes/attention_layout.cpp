// AttentionLayoutPass (see the header): match the heads-first slices of one qkv, replace
// the attention and attention_grad nodes that read them, reroute their users, reorder,
// and drop what no longer reaches an output.
#include "tessera/compiler/passes/attention_layout.h"

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "compiler/passes/topological_order.h"
#include "tessera/compiler/passes/dce.h"
#include "tessera/compiler/passes/remat.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/nn.h"

namespace tessera::compiler {
namespace {

const std::vector<int> kSwapSeqHeads = {0, 2, 1, 3};  // [B, T, H, D] <-> [B, H, T, D]

// Nodes named with checkpoint_name stay (offload reads the names); remat's clones are
// rewritten like any node, and their replacements keep the name (remat.h).
bool rewritable(const Node& n) { return fusable_after_remat(n); }

// The live, rewritable node producing v as a P, or nullptr.
template <typename P>
const P* producer_as(const Graph& g, ValueId v, const Node** node = nullptr) {
  const Node* nd = g.producer(v);
  if (nd == nullptr || nd->dead || !rewritable(*nd)) return nullptr;
  if (node != nullptr) *node = nd;
  return dynamic_cast<const P*>(nd->primitive.get());
}

// v = transpose(reshape(slice(qkv, axis 3, [start, stop)), [B, T, n, D]), [0, 2, 1, 3]).
struct HeadsSlice {
  ValueId qkv;
  int64_t start, stop;
};

std::optional<HeadsSlice> match_heads_slice(const Graph& g, ValueId v) {
  const Node* t_node = nullptr;
  const auto* t = producer_as<Transpose>(g, v, &t_node);
  if (t == nullptr || t->perm() != kSwapSeqHeads) return std::nullopt;
  const Node* r_node = nullptr;
  if (producer_as<Reshape>(g, t_node->inputs[0], &r_node) == nullptr) return std::nullopt;
  const Node* s_node = nullptr;
  const auto* s = producer_as<Slice>(g, r_node->inputs[0], &s_node);
  if (s == nullptr) return std::nullopt;
  const ValueId qkv = s_node->inputs[0];
  const Shape& in = g.type(qkv).shape;
  const Shape& sliced = g.type(r_node->inputs[0]).shape;
  const Shape& merged = g.type(t_node->inputs[0]).shape;
  if (in.size() != 5 || s->start().size() != 5) return std::nullopt;
  for (size_t a = 0; a < 5; ++a) {
    if (s->step()[a] != 1) return std::nullopt;
    if (a != 3 && (s->start()[a] != 0 || s->stop()[a] != in[a])) return std::nullopt;
  }
  // The reshape merges kv heads and slots: [B, T, Hkv, n / Hkv, D] -> [B, T, n, D].
  if (merged.size() != 4 || merged[0] != in[0] || merged[1] != in[1] || merged[3] != in[4] ||
      merged[2] != sliced[2] * sliced[3])
    return std::nullopt;
  return HeadsSlice{qkv, s->start()[3], s->stop()[3]};
}

// The qkv that q, k, v (inputs 0..2 of an attention node) are the packed slices of.
std::optional<ValueId> match_packed_qkv(const Graph& g, const Node& n) {
  const auto q = match_heads_slice(g, n.inputs[0]), k = match_heads_slice(g, n.inputs[1]),
             v = match_heads_slice(g, n.inputs[2]);
  if (!q || !k || !v || q->qkv != k->qkv || q->qkv != v->qkv) return std::nullopt;
  const Shape& s = g.type(q->qkv).shape;
  const int64_t group = s[3] - 2;
  if (group < 1 || q->start != 0 || q->stop != group || k->start != group || k->stop != group + 1 ||
      v->start != group + 1 || v->stop != group + 2)
    return std::nullopt;
  // Self-attention over the whole sequence: T == S, and the shapes of q, k, v follow.
  const Shape& qs = g.type(n.inputs[0]).shape;
  if (qs != Shape{s[0], s[2] * group, s[1], s[4]}) return std::nullopt;
  return q->qkv;
}

// The last node added takes the remat region and name of the node it replaces.
void tag_like(Graph& g, const Node& like) {
  g.nodes.back().remat_region = like.remat_region;
  g.nodes.back().remat_name = like.remat_name;
}

// A value equal to transpose(v, [0, 2, 1, 3]): the input of such a transpose if v is one,
// else a new transpose node.
ValueId swapped(Graph& g, ValueId v, const Node& like) {
  const Node* t_node = nullptr;
  const auto* t = producer_as<Transpose>(g, v, &t_node);
  if (t != nullptr && t->perm() == kSwapSeqHeads) return t_node->inputs[0];
  TensorType type = g.type(v);
  std::swap(type.shape[1], type.shape[2]);
  const ValueId out = g.add_node1(std::make_shared<Transpose>(kSwapSeqHeads), {v}, type);
  tag_like(g, like);
  return out;
}

void rewrite_forward(Graph& g, int index, ValueId qkv) {
  const Node a = g.nodes[static_cast<size_t>(index)];
  const auto& config = static_cast<const Attention&>(*a.primitive).config();
  std::vector<ValueId> inputs = {qkv};
  inputs.insert(inputs.end(), a.inputs.begin() + 3, a.inputs.end());  // mask, segments
  TensorType out_type = g.type(a.outputs[0]);
  std::swap(out_type.shape[1], out_type.shape[2]);
  const std::vector<ValueId> outs =
      g.add_node(std::make_shared<AttentionPacked>(config), inputs, {out_type, g.type(a.outputs[1])});
  tag_like(g, a);
  // The old out: a transpose of the new one, whose own transposes back read it directly.
  const ValueId old_out = swapped(g, outs[0], a);
  g.replace_uses(a.outputs[0], old_out);
  g.replace_uses(a.outputs[1], outs[1]);
  g.erase_node(index);
  const std::vector<std::vector<int>> users = g.users();
  for (int u : users[static_cast<size_t>(old_out)]) {
    const Node& user = g.nodes[static_cast<size_t>(u)];
    const auto* t = dynamic_cast<const Transpose*>(user.primitive.get());
    if (t != nullptr && t->perm() == kSwapSeqHeads && rewritable(user)) g.replace_uses(user.outputs[0], outs[0]);
  }
}

// The concatenate (axis 3) of reshape(transpose(grads[j], [0, 2, 1, 3])) for j = 0, 1, 2,
// the unpacked gradient of qkv, or nullopt.
std::optional<ValueId> packed_gradient_concat(const Graph& g, const std::vector<ValueId>& grads, const Shape& qkv) {
  const std::vector<std::vector<int>> users = g.users();
  for (int t_index : users[static_cast<size_t>(grads[0])]) {
    const Node& t = g.nodes[static_cast<size_t>(t_index)];
    for (int r_index : users[static_cast<size_t>(t.outputs[0])]) {
      const Node& r = g.nodes[static_cast<size_t>(r_index)];
      for (int c_index : users[static_cast<size_t>(r.outputs[0])]) {
        const Node& c = g.nodes[static_cast<size_t>(c_index)];
        const auto* concat = dynamic_cast<const Concatenate*>(c.primitive.get());
        if (concat == nullptr || !rewritable(c) || (concat->axis() != 3 && concat->axis() != -2) ||
            c.inputs.size() != 3 || g.type(c.outputs[0]).shape != qkv)
          continue;
        bool all = true;
        for (size_t j = 0; j < 3 && all; ++j) {
          const Node* r_node = nullptr;
          const Node* t_node = nullptr;
          const auto* tr = producer_as<Reshape>(g, c.inputs[j], &r_node) != nullptr
                               ? producer_as<Transpose>(g, r_node->inputs[0], &t_node)
                               : nullptr;
          all = tr != nullptr && tr->perm() == kSwapSeqHeads && t_node->inputs[0] == grads[j];
        }
        if (all) return c.outputs[0];
      }
    }
  }
  return std::nullopt;
}

// transpose(reshape(slice(dqkv, axis 3, [start, stop)), [B, T, n, D]), [0, 2, 1, 3]): an
// unpacked gradient for users the concatenate does not cover.
ValueId unpacked_slice(Graph& g, ValueId dqkv, int64_t start, int64_t stop, const Node& like) {
  const TensorType packed = g.type(dqkv);
  const Shape& s = packed.shape;
  std::vector<int64_t> begin(5, 0), end(s.begin(), s.end()), step(5, 1);
  begin[3] = start;
  end[3] = stop;
  const ValueId sliced = g.add_node1(std::make_shared<Slice>(begin, end, step), {dqkv},
                                     {Shape{s[0], s[1], s[2], stop - start, s[4]}, packed.dtype});
  tag_like(g, like);
  const ValueId merged = g.add_node1(std::make_shared<Reshape>(Shape{s[0], s[1], s[2] * (stop - start), s[4]}),
                                     {sliced}, {Shape{s[0], s[1], s[2] * (stop - start), s[4]}, packed.dtype});
  tag_like(g, like);
  return swapped(g, merged, like);
}

void rewrite_backward(Graph& g, int index, ValueId qkv) {
  const Node ag = g.nodes[static_cast<size_t>(index)];
  const auto& config = static_cast<const AttentionGrad&>(*ag.primitive).config();
  const size_t m = config.optional_inputs();
  std::vector<ValueId> inputs = {qkv};
  inputs.insert(inputs.end(), ag.inputs.begin() + 3, ag.inputs.begin() + 3 + static_cast<long>(m));
  inputs.push_back(swapped(g, ag.inputs[3 + m], ag));  // out [B, T, H, D]
  inputs.push_back(ag.inputs[4 + m]);                  // lse
  inputs.push_back(swapped(g, ag.inputs[5 + m], ag));  // dout [B, T, H, D]
  const ValueId dqkv = g.add_node1(std::make_shared<AttentionPackedGrad>(config), inputs, g.type(qkv));
  tag_like(g, ag);
  const Shape& s = g.type(qkv).shape;
  const int64_t group = s[3] - 2;
  if (const auto concat = packed_gradient_concat(g, ag.outputs, s)) g.replace_uses(*concat, dqkv);
  const int64_t bounds[4] = {0, group, group + 1, group + 2};
  for (size_t j = 0; j < 3; ++j) g.replace_uses(ag.outputs[j], unpacked_slice(g, dqkv, bounds[j], bounds[j + 1], ag));
  g.erase_node(index);
}

}  // namespace

void AttentionLayoutPass::run(Graph& graph) {
  // Match everything first (rewrites append nodes; indices of the old ones stay valid).
  std::map<int, ValueId> forwards, backwards;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.dead || !rewritable(node)) continue;
    const bool fwd = dynamic_cast<const Attention*>(node.primitive.get()) != nullptr;
    const bool bwd = dynamic_cast<const AttentionGrad*>(node.primitive.get()) != nullptr;
    if (!fwd && !bwd) continue;
    if (const auto qkv = match_packed_qkv(graph, node)) (fwd ? forwards : backwards)[static_cast<int>(n)] = *qkv;
  }
  if (forwards.empty() && backwards.empty()) return;
  // Forwards first: a backward then finds out as a transpose of the packed output.
  for (const auto& [n, qkv] : forwards) rewrite_forward(graph, n, qkv);
  for (const auto& [n, qkv] : backwards) rewrite_backward(graph, n, qkv);
  topological_reorder(graph);
  DeadCodeElimination().run(graph);
}

}  // namespace tessera::compiler
