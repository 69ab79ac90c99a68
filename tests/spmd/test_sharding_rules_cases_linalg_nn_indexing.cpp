// Sharding-rule cases: matmul, the fused NN primitives and indexing.
#include "sharding_rule_cases.h"
#include "tessera/ir/primitives/expert_dispatch.h"

namespace tessera::sharding_cases {

// matmul_op(A, B, trans_a, trans_b) with A = [M, K] (or [K, M]) and B = [K, N] (or
// [N, K]): every assignment of the mesh axes to M, K (of A) and K, N (of B).
std::vector<Case> matmul_cases() {
  std::vector<Case> v;
  const int64_t M = 16, K = 32, N = 24;
  auto mm = [](bool ta, bool tb) -> Fn {
    return [ta, tb](const std::vector<Array>& a) { return std::vector<Array>{matmul_op(a[0], a[1], ta, tb)}; };
  };
  // A spec from (m axes, k axes) respecting the transpose flag.
  auto spec2 = [](const Axes& first_logical, const Axes& second_logical, bool trans) {
    return trans ? P(second_logical, first_logical) : P(first_logical, second_logical);
  };
  // One-axis mesh: each of M, K(A), K(B), N split on x or not (an operand splits at most one dim).
  std::vector<std::pair<Axes, Axes>> one = {{{}, {}}, {{"x"}, {}}, {{}, {"x"}}};
  for (int t = 0; t < 4; ++t) {
    bool ta = t & 1, tb = t & 2;
    std::string flags = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
    for (const auto& [am, ak] : one)
      for (const auto& [bk, bn] : one) {
        if (am.empty() && ak.empty() && bk.empty() && bn.empty()) continue;
        Shape sa = ta ? Shape{K, M} : Shape{M, K};
        Shape sb = tb ? Shape{N, K} : Shape{K, N};
        v.push_back(make("matmul_" + flags, "x=4", {{sa, spec2(am, ak, ta)}, {sb, spec2(bk, bn, tb)}}, mm(ta, tb)));
      }
  }
  // Two-axis mesh: every assignment of {a, b} to (M, K) and (K, N), including both on one dim.
  std::vector<std::pair<Axes, Axes>> two = {{{}, {}},       {{"a"}, {}},      {{"b"}, {}},
                                            {{}, {"a"}},    {{}, {"b"}},      {{"a"}, {"b"}},
                                            {{"b"}, {"a"}}, {{"a", "b"}, {}}, {{}, {"a", "b"}}};
  for (const auto& [am, ak] : two)
    for (const auto& [bk, bn] : two) {
      if (am.empty() && ak.empty() && bk.empty() && bn.empty()) continue;
      v.push_back(make("matmul_nn", "a=2,b=2", {{{M, K}, P(am, ak)}, {{K, N}, P(bk, bn)}}, mm(false, false)));
    }
  // Both operands transposed, every assignment on a two-axis mesh of 8 devices.
  for (const auto& [am, ak] : two)
    for (const auto& [bk, bn] : two) {
      if (am.empty() && ak.empty() && bk.empty() && bn.empty()) continue;
      v.push_back(make("matmul_tt", "a=4,b=2", {{{K, M}, P(ak, am)}, {{N, K}, P(bn, bk)}}, mm(true, true)));
    }
  // Transposed operands on a two-axis mesh of 8 devices.
  for (int t = 1; t < 3; ++t) {
    bool ta = t & 1, tb = t & 2;
    std::string flags = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
    for (const auto& [am, ak, bk, bn] : std::vector<std::tuple<Axes, Axes, Axes, Axes>>{
             {{"a"}, {"b"}, {"b"}, {}}, {{"a"}, {}, {}, {"b"}}, {{}, {"a"}, {"b"}, {}}, {{"b"}, {"a"}, {}, {"a"}}}) {
      Shape sa = ta ? Shape{K, M} : Shape{M, K};
      Shape sb = tb ? Shape{N, K} : Shape{K, N};
      v.push_back(make("matmul_" + flags, "a=2,b=4", {{sa, spec2(am, ak, ta)}, {sb, spec2(bk, bn, tb)}}, mm(ta, tb)));
    }
  }
  // Batched [B, M, K] @ [K, N] and [B, M, K] @ [B, K, N].
  const int64_t B = 4;
  Fn plain = [](const std::vector<Array>& a) { return std::vector<Array>{matmul(a[0], a[1])}; };
  std::vector<PartitionSpec> lhs3 = {
      P("a"), P("a", "b"), P("a", None, "b"), P(None, "a", "b"), P(Axes{"a", "b"}), P("b", None, "a")};
  std::vector<PartitionSpec> rhs2 = {P(), P("b"), P(None, "b"), P("a"), P("b", "a")};
  for (const auto& l : lhs3)
    for (const auto& r : rhs2) v.push_back(make("bmm_shared_rhs", "a=2,b=2", {{{B, M, K}, l}, {{K, N}, r}}, plain));
  std::vector<PartitionSpec> rhs3 = {P("a"), P("a", "b"),       P("a", None, "b"), P(None, "b"),
                                     P("b"), P(Axes{"a", "b"}), P(None, "a")};
  for (const auto& l : lhs3)
    for (const auto& r : rhs3) {
      Case c = make("bmm", "a=2,b=2", {{{B, M, K}, l}, {{B, K, N}, r}}, plain);
      // A's batch on b with a on its K, B's batch on a: axis a splits K of one operand
      // and the batch of the other, which the rule refuses to guess about.
      const Axes& lb = l.dims[0];
      const Axes& rb = r.dims[0];
      if (!lb.empty() && !rb.empty() && lb[0] != rb[0]) c.error = "split batch dimension 0 differently";
      v.push_back(c);
    }
  v.push_back(make("bmm", "x=8", {{{8, M, K}, P("x")}, {{8, K, N}, P("x")}}, plain, true, "P('x')"));
  v.push_back(make("bmm_nt", "a=4,b=2", {{{B, M, K}, P("a", None, "b")}, {{B, N, K}, P("a", None, "b")}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{matmul_op(a[0], a[1], false, true)}; }));
  return v;
}

std::vector<Case> nn_cases() {
  std::vector<Case> v;
  Fn sm = [](const std::vector<Array>& a) { return std::vector<Array>{softmax(a[0])}; };
  Fn lsm = [](const std::vector<Array>& a) { return std::vector<Array>{log_softmax(a[0])}; };
  Fn sm0 = [](const std::vector<Array>& a) { return std::vector<Array>{softmax(a[0], 0)}; };
  v.push_back(make("softmax_rows", "x=4", {{{8, 16}, P("x")}}, sm, true, "P('x')"));
  v.push_back(make("softmax_normalized_dim", "x=2", {{{8, 16}, P(None, "x")}}, sm));
  v.push_back(make("softmax_rank3", "a=2,b=4", {{{4, 8, 16}, P("a", "b")}}, sm, true, "P('a', 'b')"));
  v.push_back(make("softmax_axis0", "x=8", {{{8, 16}, P("x")}}, sm0));
  v.push_back(make("log_softmax_rows", "x=8", {{{8, 16}, P("x")}}, lsm, true, "P('x')"));
  v.push_back(make("log_softmax_both", "a=2,b=2", {{{8, 16}, P("a", "b")}}, lsm));

  Fn ln = [](const std::vector<Array>& a) { return std::vector<Array>{layer_norm(a[0], a[1], a[2])}; };
  Fn rms = [](const std::vector<Array>& a) { return std::vector<Array>{rms_norm(a[0], a[1])}; };
  Fn ln_plain = [](const std::vector<Array>& a) { return std::vector<Array>{layer_norm(a[0])}; };
  v.push_back(make("layer_norm_rows", "x=4", {{{8, 16}, P("x")}, {{16}, P()}, {{16}, P()}}, ln, true, "P('x')"));
  v.push_back(make("layer_norm_features", "x=2", {{{8, 16}, P(None, "x")}, {{16}, P("x")}, {{16}, P("x")}}, ln));
  v.push_back(make("layer_norm_rank3", "a=2,b=2", {{{4, 8, 16}, P("a", "b")}, {{16}, P("b")}, {{16}, P()}}, ln, true,
                   "P('a', 'b')"));
  v.push_back(make("layer_norm_no_params", "x=8", {{{8, 16}, P("x")}}, ln_plain));
  v.push_back(make("rms_norm_rows", "x=8", {{{16, 16}, P("x")}, {{16}, P()}}, rms, true, "P('x')"));
  v.push_back(make("rms_norm_rank3", "a=4,b=2", {{{4, 8, 16}, P("a", "b")}, {{16}, P("a")}}, rms));

  // Attention: q [B, H, T, D], k/v [B, Hkv, S, D].
  auto attn = [](bool causal) -> Fn {
    return [causal](const std::vector<Array>& a) {
      return std::vector<Array>{scaled_dot_product_attention(a[0], a[1], a[2], causal)};
    };
  };
  Fn attn_mask = [](const std::vector<Array>& a) {
    return std::vector<Array>{scaled_dot_product_attention(a[0], a[1], a[2], false, a[3])};
  };
  auto qkv = [](Shape q, Shape kv, const PartitionSpec& sq, const PartitionSpec& skv) {
    return std::vector<Arg>{{q, sq}, {kv, skv}, {kv, skv}};
  };
  v.push_back(make("attention_causal_batch", "x=2", qkv({2, 4, 8, 8}, {2, 4, 8, 8}, P("x"), P("x")), attn(true), true,
                   "P('x')"));
  v.push_back(make("attention_heads", "x=4", qkv({2, 4, 8, 8}, {2, 4, 8, 8}, P(None, "x"), P(None, "x")), attn(true),
                   true, "P(None, 'x')"));
  v.push_back(make("attention_gqa_heads", "x=4", qkv({2, 8, 8, 8}, {2, 4, 8, 8}, P(None, "x"), P(None, "x")),
                   attn(true), true, "P(None, 'x')"));
  v.push_back(
      make("attention_gqa_heads_indivisible", "x=4", qkv({2, 8, 8, 8}, {2, 2, 8, 8}, P(None, "x"), P()), attn(true)));
  v.push_back(make("attention_gqa_batch_heads", "a=2,b=2", qkv({2, 4, 8, 8}, {2, 2, 8, 8}, P("a", "b"), P("a", "b")),
                   attn(false), true, "P('a', 'b')"));
  v.push_back(make("attention_seq_split", "x=2",
                   qkv({2, 4, 8, 8}, {2, 2, 16, 8}, P(None, None, "x"), P(None, None, "x")), attn(false)));
  v.push_back(make("attention_q_only_split", "x=8", qkv({2, 8, 8, 8}, {2, 8, 8, 8}, P(None, "x"), P()), attn(true)));
  v.push_back(make("attention_mask", "a=4,b=2",
                   {{{4, 4, 8, 8}, P("a", "b")},
                    {{4, 2, 8, 8}, P("a", "b")},
                    {{4, 2, 8, 8}, P("a", "b")},
                    {{4, 1, 8, 8}, P("a"), Gen::Mask}},
                   attn_mask));
  // Segment ids [B, T] (unsorted ids in [0, 3)): split with the batch, or along the
  // sequence (then gathered: attention needs whole rows).
  Fn attn_segments = [](const std::vector<Array>& a) {
    return std::vector<Array>{scaled_dot_product_attention(a[0], a[1], a[2], true, std::nullopt, std::nullopt, a[3])};
  };
  v.push_back(make("attention_segments_batch_heads", "a=2,b=2",
                   {{{4, 4, 8, 8}, P("a", "b")},
                    {{4, 2, 8, 8}, P("a", "b")},
                    {{4, 2, 8, 8}, P("a", "b")},
                    {{4, 8}, P("a"), Gen::Index, 3}},
                   attn_segments));
  v.push_back(make(
      "attention_segments_seq_split", "x=2",
      {{{2, 4, 8, 8}, P("x")}, {{2, 2, 8, 8}, P("x")}, {{2, 2, 8, 8}, P("x")}, {{2, 8}, P(None, "x"), Gen::Index, 3}},
      attn_segments));

  // Cross-entropy: logits [N, V] (or [B, T, V]), integer targets (some ignored).
  auto ce = [](Reduction r) -> Fn {
    return [r](const std::vector<Array>& a) { return std::vector<Array>{cross_entropy(a[0], a[1], -100, r)}; };
  };
  v.push_back(
      make("cross_entropy_rows", "x=4", {{{16, 32}, P("x")}, {{16}, P("x"), Gen::Targets, 32}}, ce(Reduction::Mean)));
  v.push_back(make("cross_entropy_rows_none", "x=8", {{{16, 32}, P("x")}, {{16}, P("x"), Gen::Targets, 32}},
                   ce(Reduction::None), true, "P('x')"));
  v.push_back(make("cross_entropy_vocab", "x=4", {{{16, 32}, P(None, "x")}, {{16}, P(), Gen::Targets, 32}},
                   ce(Reduction::Sum)));
  v.push_back(make("cross_entropy_rows_vocab", "a=2,b=2", {{{16, 32}, P("a", "b")}, {{16}, P("a"), Gen::Targets, 32}},
                   ce(Reduction::Mean)));
  v.push_back(make("cross_entropy_targets_split", "x=2", {{{16, 32}, P()}, {{16}, P("x"), Gen::Targets, 32}},
                   ce(Reduction::None)));
  // A padded vocabulary (21 classes of 32 columns): the last device holds only padding.
  auto ce_padded = [](const std::vector<Array>& a) {
    return std::vector<Array>{cross_entropy(a[0], a[1], -100, Reduction::Mean, 21)};
  };
  v.push_back(
      make("cross_entropy_vocab_padded", "x=4", {{{16, 32}, P(None, "x")}, {{16}, P(), Gen::Targets, 21}}, ce_padded));
  v.push_back(make("cross_entropy_rows_vocab_padded", "a=2,b=2",
                   {{{16, 32}, P("a", "b")}, {{16}, P("a"), Gen::Targets, 21}}, ce_padded));
  v.push_back(make("cross_entropy_rank3", "a=2,b=4",
                   {{{4, 8, 32}, P("a", "b")}, {{4, 8}, P("a", "b"), Gen::Targets, 32}}, ce(Reduction::Mean)));
  return v;
}

std::vector<Case> indexing_cases() {
  std::vector<Case> v;
  // take(table [V, E], ids [B, T], 0): the embedding lookup; its gradient is scatter_add.
  Fn embed = [](const std::vector<Array>& a) { return std::vector<Array>{take(a[0], a[1], 0)}; };
  v.push_back(make("take_embed_dim", "x=4", {{{32, 16}, P(None, "x")}, {{4, 8}, P(), Gen::Index, 32}}, embed, true,
                   "P(None, None, 'x')"));
  v.push_back(make("take_indices", "x=4", {{{32, 16}, P()}, {{4, 8}, P("x"), Gen::Index, 32}}, embed, true, "P('x')"));
  v.push_back(make("take_both", "a=2,b=2", {{{32, 16}, P(None, "b")}, {{4, 8}, P("a"), Gen::Index, 32}}, embed, true,
                   "P('a', None, 'b')"));
  v.push_back(make("take_vocab_split", "x=8", {{{32, 16}, P("x")}, {{4, 8}, P(None, "x"), Gen::Index, 32}}, embed));
  v.push_back(make("take_same_axis", "x=2", {{{32, 16}, P(None, "x")}, {{4, 8}, P(None, "x"), Gen::Index, 32}}, embed));
  // The lookup's cotangent arrives split on the embed dim (a larger operand downstream
  // wins the layout) while the ids are split on the same axis: scatter_add gathers the
  // ids' split (an axis may not both split the table and be a partial sum).
  {
    Case c = make("take_cotangent_embed_split", "x=2",
                  {{{32, 16}, P()}, {{4, 8}, P(None, "x"), Gen::Index, 32}, {{2, 4, 8, 16}, P(None, None, None, "x")}},
                  [](const std::vector<Array>& a) { return std::vector<Array>{multiply(take(a[0], a[1], 0), a[2])}; });
    v.push_back(c);
  }
  v.push_back(
      make("take_seq_indices", "a=2,b=4", {{{32, 16}, P(None, "a")}, {{4, 8}, P(None, "b"), Gen::Index, 32}}, embed));
  v.push_back(make("take_axis1", "a=2,b=2", {{{8, 32}, P("a", "b")}, {{6}, P(), Gen::Index, 32}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{take(a[0], a[1], 1)}; }));
  Fn along1 = [](const std::vector<Array>& a) { return std::vector<Array>{take_along_axis(a[0], a[1], 1)}; };
  Fn along0 = [](const std::vector<Array>& a) { return std::vector<Array>{take_along_axis(a[0], a[1], 0)}; };
  v.push_back(
      make("take_along_rows", "x=4", {{{8, 16}, P("x")}, {{8, 3}, P("x"), Gen::Index, 16}}, along1, true, "P('x')"));
  v.push_back(make("take_along_split_axis", "x=2", {{{8, 16}, P(None, "x")}, {{8, 3}, P(), Gen::Index, 16}}, along1));
  v.push_back(
      make("take_along_axis0", "a=2,b=4", {{{8, 16}, P("a", "b")}, {{3, 16}, P(None, "b"), Gen::Index, 8}}, along0));
  v.push_back(make("take_along_idx_only", "x=8", {{{8, 16}, P()}, {{8, 4}, P("x"), Gen::Index, 16}}, along1));

  // adamw_update: p, g, m, v (v >= 0), static and dynamic (lr and step as arrays).
  Fn adamw_static = [](const std::vector<Array>& a) {
    AdamWConfig config;
    config.lr = 0.01;
    config.weight_decay = 0.1;
    config.step = 3;
    return adamw_update(a[0], a[1], a[2], a[3], config);
  };
  Fn adamw_dynamic = [](const std::vector<Array>& a) {
    AdamWConfig config;
    config.weight_decay = 0.1;
    return adamw_update(a[0], a[1], a[2], a[3], a[4], a[5], config);
  };
  auto state = [](const PartitionSpec& p, const PartitionSpec& g) {
    return std::vector<Arg>{{{16, 8}, p}, {{16, 8}, g}, {{16, 8}, p}, {{16, 8}, p, Gen::Positive}};
  };
  v.push_back(make("adamw", "x=4", state(P("x"), P("x")), adamw_static, false, "P('x')"));
  v.push_back(make("adamw_grad_other_layout", "x=8", state(P("x"), P(None, "x")), adamw_static, false, "P('x')"));
  v.push_back(make("adamw_grad_replicated", "a=2,b=2", state(P("a", "b"), P()), adamw_static, false, "P('a', 'b')"));
  {
    std::vector<Arg> args = state(P("b", "a"), P("b"));
    args.push_back({{}, P(), Gen::Positive});
    args.push_back({{}, P(), Gen::Step});
    v.push_back(make("adamw_dynamic", "a=2,b=4", args, adamw_dynamic, false, "P('b', 'a')"));
  }
  // The FSDP update: the gradient is a partial sum (a matmul over the split batch)
  // reduce-scattered onto the parameter's layout.
  v.push_back(make(
      "adamw_partial_grad", "x=4",
      {{{16, 8}, P("x")}, {{32, 16}, P("x")}, {{32, 8}, P("x")}, {{16, 8}, P("x")}, {{16, 8}, P("x"), Gen::Positive}},
      [](const std::vector<Array>& a) {
        AdamWConfig config;
        config.lr = 0.01;
        Array g = matmul_op(a[1], a[2], true, false);  // [16, 8], partial over x
        return adamw_update(a[0], g, a[3], a[4], config);
      },
      false, "P('x')"));

  // lion_update: p, g, m, static and dynamic (lr as an array), and the FSDP update.
  Fn lion_static = [](const std::vector<Array>& a) {
    LionConfig config;
    config.lr = 0.01;
    config.weight_decay = 0.1;
    return lion_update(a[0], a[1], a[2], config);
  };
  Fn lion_dynamic = [](const std::vector<Array>& a) {
    LionConfig config;
    config.weight_decay = 0.1;
    return lion_update(a[0], a[1], a[2], a[3], config);
  };
  auto lion_state = [](const PartitionSpec& p, const PartitionSpec& g) {
    return std::vector<Arg>{{{16, 8}, p}, {{16, 8}, g}, {{16, 8}, p}};
  };
  v.push_back(make("lion", "x=4", lion_state(P("x"), P("x")), lion_static, false, "P('x')"));
  v.push_back(make("lion_grad_other_layout", "x=8", lion_state(P("x"), P(None, "x")), lion_static, false, "P('x')"));
  v.push_back(make("lion_grad_replicated", "a=2,b=2", lion_state(P("a", "b"), P()), lion_static, false, "P('a', 'b')"));
  {
    std::vector<Arg> args = lion_state(P("b", "a"), P("b"));
    args.push_back({{}, P(), Gen::Positive});
    v.push_back(make("lion_dynamic", "a=2,b=4", args, lion_dynamic, false, "P('b', 'a')"));
  }
  v.push_back(make(
      "lion_partial_grad", "x=4", {{{16, 8}, P("x")}, {{32, 16}, P("x")}, {{32, 8}, P("x")}, {{16, 8}, P("x")}},
      [](const std::vector<Array>& a) {
        LionConfig config;
        config.lr = 0.01;
        config.weight_decay = 0.1;
        Array g = matmul_op(a[1], a[2], true, false);  // [16, 8], partial over x
        return lion_update(a[0], g, a[3], config);
      },
      false, "P('x')"));
  // quantized_matmul: M and N splits are kept (rows and columns quantize on their own);
  // a split K is gathered (every scale spans all of K). The backward GEMMs are int8
  // too (the grad comparison), the token axis contracted by dW gathered.
  Fn int8 = [](const std::vector<Array>& a) { return std::vector<Array>{quantized_matmul(a[0], a[1])}; };
  v.push_back(make("quantized_matmul_rows", "x=4", {{{16, 8}, P("x")}, {{8, 12}, P()}}, int8, true, "P('x')"));
  v.push_back(
      make("quantized_matmul_columns", "x=4", {{{16, 8}, P()}, {{8, 12}, P(None, "x")}}, int8, true, "P(None, 'x')"));
  v.push_back(make("quantized_matmul_k", "x=4", {{{16, 8}, P(None, "x")}, {{8, 12}, P("x")}}, int8, true));
  v.push_back(make("quantized_matmul_2d", "a=2,b=2", {{{16, 8}, P("a", "b")}, {{8, 12}, P("b", "a")}}, int8, true));
  v.push_back(make("quantized_matmul_3d", "x=2", {{{2, 8, 8}, P("x")}, {{8, 12}, P(None, "x")}}, int8, true));
  // grouped_matmul (a [G, N, K], w [E, K, M], fixed group sizes): G and M splits are
  // kept, a K split alike on both gives a partial sum, split experts or rows are gathered.
  // The grad comparison runs grouped_matmul_weight_grad (a batch split: a partial sum).
  auto grouped = [](bool trans) -> Fn {
    return [trans](const std::vector<Array>& a) {
      const Array sizes = Array::from_vector(std::vector<int64_t>{3, 0, 2, 3, 2, 2, 1, 1}, {2, 4});
      return std::vector<Array>{grouped_matmul(a[0], a[1], sizes, trans)};
    };
  };
  v.push_back(
      make("grouped_matmul_batch", "x=2", {{{2, 8, 6}, P("x")}, {{4, 6, 4}, P()}}, grouped(false), true, "P('x')"));
  v.push_back(make("grouped_matmul_m", "x=2", {{{2, 8, 6}, P()}, {{4, 6, 4}, P(None, None, "x")}}, grouped(false), true,
                   "P(None, None, 'x')"));
  v.push_back(make("grouped_matmul_k", "x=2", {{{2, 8, 6}, P(None, None, "x")}, {{4, 6, 4}, P(None, "x")}},
                   grouped(false), true));
  v.push_back(make("grouped_matmul_experts_rows", "a=2,b=2", {{{2, 8, 6}, P("a", "b")}, {{4, 6, 4}, P("b")}},
                   grouped(false), true, "P('a')"));
  v.push_back(make("grouped_matmul_trans", "a=2,b=2", {{{2, 8, 6}, P("a")}, {{4, 4, 6}, P(None, "b")}}, grouped(true),
                   true, "P('a', None, 'b')"));
  // With a shard dim (a [S, G, N, K], w [S, E, K, M], sizes [S, G, E]): S split alike on
  // both needs no communication (from a's split, else w's), G and M as above.
  auto sharded = [](bool trans) -> Fn {
    return [trans](const std::vector<Array>& a) {
      const Array sizes = Array::from_vector(std::vector<int64_t>{3, 2, 0, 4, 1, 1, 5, 2}, {2, 2, 2});
      return std::vector<Array>{grouped_matmul(a[0], a[1], sizes, trans)};
    };
  };
  v.push_back(make("grouped_matmul_shards", "x=2", {{{2, 2, 8, 6}, P("x")}, {{2, 2, 6, 4}, P("x")}}, sharded(false),
                   true, "P('x')"));
  v.push_back(make("grouped_matmul_shards_from_w", "x=2", {{{2, 2, 8, 6}, P()}, {{2, 2, 4, 6}, P("x")}}, sharded(true),
                   true, "P('x')"));
  v.push_back(make("grouped_matmul_shards_groups_m", "a=2,b=2",
                   {{{2, 2, 8, 6}, P("a", "b")}, {{2, 2, 6, 4}, P("a", None, None, "b")}}, sharded(false), true,
                   "P('a', 'b')"));
  // expert_dispatch / expert_combine: the groups split over the expert axis become
  // shard buffers split over it (a ragged all-to-all); the grad runs the transpose.
  auto dispatch = [](const std::vector<Array>& a) {
    const Array sizes = Array::from_vector(std::vector<int64_t>{3, 0, 2, 3, 2, 2, 1, 1}, {2, 4});
    return std::vector<Array>{expert_dispatch(a[0], sizes, 2, {"x"})};
  };
  auto combine = [](const std::vector<Array>& a) {
    const Array sizes = Array::from_vector(std::vector<int64_t>{3, 0, 2, 3, 2, 2, 1, 1}, {2, 4});
    return std::vector<Array>{expert_combine(a[0], sizes, {"x"})};
  };
  v.push_back(make("expert_dispatch", "x=2", {{{2, 8, 6}, P("x")}}, dispatch, true, "P('x')"));
  // (Replicated operands run the op whole on every device, as every op's do.)
  v.push_back(make("expert_dispatch_replicated", "x=2", {{{2, 8, 6}, P()}}, dispatch, true, "replicated"));
  v.push_back(make("expert_combine", "x=2", {{{2, 2, 8, 6}, P("x")}}, combine, true, "P('x')"));
  v.push_back(make("expert_dispatch_no_expert_axis", "a=2", {{{2, 8, 6}, P("a")}}, dispatch, true, "P(None, 'a')"));
  return v;
}

}  // namespace tessera::sharding_cases
