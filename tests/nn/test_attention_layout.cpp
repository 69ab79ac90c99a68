// Attention layout (compiler/passes/attention_layout.h): a transformer attention block's
// value and gradients compiled with the pass read q, k, v in place from the fused
// projection (attention_packed / attention_packed_grad, no transpose, slice or
// concatenate left) and are bitwise those of the pipeline without it, for float32 and
// bfloat16, multi-head and grouped-query, with packed documents' segment ids and under
// remat (whose recomputed projection keeps its GEMM epilogue); the packed primitives
// equal their composites (float64) and parse back.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "compiler/graph_test_util.h"
#include "core/test_util.h"
#include "tessera/api/jit.h"
#include "tessera/compiler/compile.h"
#include "tessera/compiler/graph.h"
#include "tessera/compiler/parser.h"
#include "tessera/core/checkpoint.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/param.h"
#include "tessera/tessera.h"

namespace tessera::compiler {
namespace {

using test_util::count_nodes;
using test_util::expect_bitwise;
using test_util::interpret;

// The default pipeline with or without the attention-layout pass.
Graph compiled(const Graph& g, bool with_layout) {
  CompileOptions options;
  options.packed_attention = with_layout;
  const Pipeline all = default_pipeline(options);
  Pipeline pipeline;
  for (const PassPtr& pass : all.passes()) pipeline.add(pass);
  Graph out = g;
  pipeline.run(out);
  return out;
}

struct Case {
  int64_t heads, kv_heads;
  bool segments;
  DType dtype;
  bool checkpointed = false;  // the block in checkpoint(): recomputed for the backward
};

std::string describe(const Case& c) {
  return fmt::format("heads {} kv {}{} {}{}", c.heads, c.kv_heads, c.segments ? " segments" : "", name(c.dtype),
                     c.checkpointed ? " checkpointed" : "");
}

// loss = sum(attn(x)^2) and its gradients with respect to the parameters and x, traced.
Graph traced_block(const Case& c, int64_t batch, int64_t seq, int64_t dim) {
  const nn::Attention attn{.dim = dim, .heads = c.heads, .kv_heads = c.kv_heads};
  nn::ParamScope scope(5, DType::Float32);
  Tree args = attn.init(scope);
  args["x"] = Tree(Array::placeholder({batch, seq, dim}, DType::Float32));
  if (c.segments) args["segments"] = Tree(Array::placeholder({batch, seq}, DType::Int32));
  for (const char* name : {"wqkv", "bqkv", "wo", "bo"})
    args[name] = Tree(Array::placeholder(args.at(name).leaf().shape(), DType::Float32));
  const Case cc = c;
  auto step = [attn, cc, seq](const Tree& a, const StaticArgs&) {
    auto loss_of = [&](const Tree& p) {
      Tree weights;
      for (const char* name : {"wqkv", "bqkv", "wo", "bo"}) weights[name] = Tree(astype(p.at(name).leaf(), cc.dtype));
      const Array x = astype(p.at("x").leaf(), cc.dtype);
      auto block = [&](const Array& in) {
        if (!cc.segments) return attn(weights, in);
        const Array segments = a.at("segments").leaf();
        const Array positions = broadcast_to(reshape(arange(seq), {1, seq}), segments.shape());
        return attn(weights, in, nn::Packing{segments, positions});
      };
      const Array y = cc.checkpointed ? checkpoint(std::function<Array(const Array&)>(block))(x) : block(x);
      const Array y32 = astype(y, DType::Float32);
      return sum(y32 * y32);
    };
    Tree params;
    for (const char* name : {"wqkv", "bqkv", "wo", "bo", "x"}) params[name] = a.at(name);
    auto [loss, grads] = value_and_grad(TreeFn(loss_of))(params);
    return Tree{{"loss", Tree(loss)}, {"grads", grads}};
  };
  return trace(step, args);
}

std::vector<Array> inputs_for(const Graph& g, int64_t batch, int64_t seq, uint32_t seed) {
  std::vector<Array> params = test_util::random_params(g, seed);
  for (size_t i = 0; i < g.parameters.size(); ++i) {
    if (g.type(g.parameters[i]).dtype != DType::Int32) continue;
    // Documents of lengths 3, seq - 3 in row 0 and one document in the others.
    std::vector<int32_t> ids(static_cast<size_t>(batch * seq), 0);
    for (int64_t t = 3; t < seq; ++t) ids[static_cast<size_t>(t)] = 1;
    params[i] = Array::from_vector(ids, {batch, seq});
  }
  return params;
}

TEST(AttentionLayout, TheBlockReadsQkvInPlaceBitwiseTheSame) {
  for (const Case& c :
       {Case{4, 4, false, DType::Float32}, Case{4, 4, false, DType::BFloat16}, Case{4, 2, false, DType::Float32},
        Case{6, 2, true, DType::BFloat16}, Case{4, 4, true, DType::Float32}}) {
    SCOPED_TRACE(describe(c));
    const int64_t batch = 2, seq = 7, dim = 24;
    const Graph g = traced_block(c, batch, seq, dim);
    const Graph before = compiled(g, false), after = compiled(g, true);
    EXPECT_EQ(count_nodes(before, "attention"), 1u) << before.text();
    EXPECT_EQ(count_nodes(after, "attention_packed"), 1u) << after.text();
    EXPECT_EQ(count_nodes(after, "attention_packed_grad"), 1u) << after.text();
    EXPECT_EQ(count_nodes(after, "attention"), 0u);
    EXPECT_EQ(count_nodes(after, "attention_grad"), 0u);
    // The copies around attention are gone (the block has no other layout op).
    EXPECT_GT(count_nodes(before, "transpose") + count_nodes(before, "slice"), 0u);
    for (const char* copy : {"transpose", "slice", "concatenate", "slice_pad"})
      EXPECT_EQ(count_nodes(after, copy), 0u) << copy << "\n" << after.text();
    const std::vector<Array> in = inputs_for(g, batch, seq, 21);
    expect_bitwise(interpret(after, in), interpret(before, in));
    expect_bitwise(interpret(after, in), interpret(g, in));
  }
}

// True when some add reads a plain matmul's output: a bias the GEMM epilogue left out.
bool has_unfused_bias(const Graph& g) {
  for (const Node& node : g.nodes) {
    if (node.dead || node.primitive->name() != "add") continue;
    for (ValueId in : node.inputs) {
      const Node* p = g.producer(in);
      if (p != nullptr && p->primitive->name() == "matmul") return true;
    }
  }
  return false;
}

TEST(AttentionLayout, RecomputedAttentionUnderRematFoldsToo) {
  const Case c{4, 2, false, DType::BFloat16, true};
  const int64_t batch = 2, seq = 5, dim = 16;
  const Graph g = traced_block(c, batch, seq, dim);
  const Graph before = compiled(g, false), after = compiled(g, true);
  EXPECT_GE(count_nodes(after, "attention_packed"), 1u) << after.text();
  EXPECT_EQ(count_nodes(after, "attention_packed_grad"), 1u) << after.text();
  EXPECT_EQ(count_nodes(after, "attention") + count_nodes(after, "attention_grad"), 0u) << after.text();
  for (const char* copy : {"transpose", "slice", "concatenate", "slice_pad"})
    EXPECT_EQ(count_nodes(after, copy), 0u) << copy << "\n" << after.text();
  // The recomputed projection runs the forward's kernels too (its bias in the GEMM's
  // epilogue): otherwise its bf16 roundings on a GPU differ and remat changes results.
  EXPECT_FALSE(has_unfused_bias(after)) << after.text();
  const std::vector<Array> in = inputs_for(g, batch, seq, 5);
  expect_bitwise(interpret(after, in), interpret(before, in));
}

TEST(AttentionLayout, AttentionWhoseOutputIsUsedUnpackedStaysCorrect) {
  // The heads-first output is returned as it is: the pass still packs the attention and
  // makes the transpose back for that use.
  const int64_t b = 2, t = 6, hkv = 2, g = 2, d = 4;
  auto fn = [&](const Tree& a, const StaticArgs&) {
    const Array qkv = a.at("qkv").leaf();
    auto heads_first = [&](int64_t start, int64_t stop, int64_t n) {
      return transpose(reshape(slice_axis(qkv, 3, start, stop), {b, t, n, d}), {0, 2, 1, 3});
    };
    const Array out = scaled_dot_product_attention(heads_first(0, g, hkv * g), heads_first(g, g + 1, hkv),
                                                   heads_first(g + 1, g + 2, hkv), true);
    return Tree{{"out", Tree(out)}};
  };
  const Graph graph = trace(fn, Tree{{"qkv", Tree(Array::placeholder({b, t, hkv, g + 2, d}, DType::Float32))}});
  const Graph after = compiled(graph, true);
  EXPECT_EQ(count_nodes(after, "attention_packed"), 1u) << after.text();
  EXPECT_EQ(count_nodes(after, "transpose"), 1u) << after.text();
  const std::vector<Array> in = test_util::random_params(graph, 9);
  expect_bitwise(interpret(after, in), interpret(graph, in));
}

// The packed kernels (the CPU eval) against the composites (attention's composite on the
// unpacked q, k, v), float64, forward and backward, with segment ids and a mask.
TEST(AttentionLayout, PackedPrimitivesMatchTheirComposites) {
  for (bool masked : {false, true}) {
    for (bool segments : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "mask " << masked << " segments " << segments);
      const int64_t b = 2, t = 9, hkv = 2, g = 3, d = 5, h = hkv * g;
      const AttentionConfig config{.causal = !masked, .scale = 0.37, .has_mask = masked, .has_segments = segments};
      const Array qkv = test::random_array({b, t, hkv, g + 2, d}, 3);
      std::vector<Array> in = {qkv};
      if (masked) {
        std::vector<bool> visible(static_cast<size_t>(t * t));
        for (size_t i = 0; i < visible.size(); ++i) visible[i] = (i * 7) % 5 != 0;
        in.push_back(Array::from_vector(visible, {1, 1, t, t}));
      }
      if (segments) {
        std::vector<int32_t> ids(static_cast<size_t>(b * t), 0);
        for (int64_t i = 4; i < t; ++i) ids[static_cast<size_t>(i)] = 1;
        in.push_back(Array::from_vector(ids, {b, t}));
      }
      AttentionPacked fwd(config);
      std::vector<Array> outs = {Array::placeholder({b, t, h, d}, DType::Float64),
                                 Array::placeholder({b, h, t}, DType::Float64)};
      fwd.eval_cpu(in, outs);
      const std::vector<Array> want = fwd.composite(in);
      EXPECT_CLOSE(outs[0], want[0].eval(), 1e-12, 1e-12);
      EXPECT_CLOSE(outs[1], want[1].eval(), 1e-12, 1e-12);

      std::vector<Array> grad_in = in;
      grad_in.push_back(outs[0]);
      grad_in.push_back(outs[1]);
      grad_in.push_back(test::random_array({b, t, h, d}, 4));
      AttentionPackedGrad bwd(config);
      std::vector<Array> dqkv = {Array::placeholder(qkv.shape(), DType::Float64)};
      bwd.eval_cpu(grad_in, dqkv);
      EXPECT_CLOSE(dqkv[0], bwd.composite(grad_in)[0].eval(), 1e-12, 1e-12);
    }
  }
}

TEST(AttentionLayout, PackedNodesParseBack) {
  const Case c{4, 2, true, DType::BFloat16};
  const Graph after = compiled(traced_block(c, 2, 5, 16), true);
  ASSERT_EQ(count_nodes(after, "attention_packed"), 1u);
  const Graph reparsed = parse_graph(after.text());
  EXPECT_EQ(reparsed.text(), after.text());
}

// On for GPU programs only (jit sets it for a CUDA device): the CPU kernels would copy
// to their own layout inside the op, which costs more than the transposes.
TEST(AttentionLayout, OnlyProgramsForTheGpuPack) {
  auto has_pass = [](const CompileOptions& o) {
    const Pipeline p = default_pipeline(o);
    return p.text().find("attention-layout") != std::string::npos;
  };
  EXPECT_FALSE(has_pass(CompileOptions{}));
  CompileOptions gpu;
  gpu.packed_attention = true;
  EXPECT_TRUE(has_pass(gpu));
}

TEST(AttentionLayout, PackedShapesAreChecked) {
  EXPECT_THROW(packed_qkv_shape("attention_packed", {2, 3, 4, 5}), ShapeError);
  EXPECT_THROW(packed_qkv_shape("attention_packed", {2, 3, 4, 2, 8}), ShapeError);
  const PackedQkvShape s = packed_qkv_shape("attention_packed", {2, 3, 4, 5, 8});
  EXPECT_EQ(s.heads(), 12);
  EXPECT_EQ(s.group, 3);
}

}  // namespace
}  // namespace tessera::compiler
