// nn/ modules against float64 naive references (nn_reference.h): Linear, Embedding,
// LayerNorm, RMSNorm, RoPE at an offset, attention (multi-head and grouped-query, with
// RoPE and the causal mask; incremental decoding through a KV cache), GELU MLP,
// SwiGLU and dropout. Parameters are float64 and randomized (not their zero/one
// initial values), so a misplaced bias or scale is caught.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "nn/nn_reference.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/dropout.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/layer_norm.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/rms_norm.h"
#include "tessera/nn/rotary.h"
#include "tessera/tessera.h"

namespace tessera::nn {
namespace {

using test::random_array;
using Vec = std::vector<double>;

constexpr double kTol = 1e-10;

// Every leaf replaced by uniform(-0.5, 0.5) values of its shape, float64.
Tree randomized(const Tree& params, uint32_t seed) {
  uint32_t next = seed;
  return params.map([&](const Array& a) { return random_array(a.shape(), next++, DType::Float64, -0.5, 0.5); });
}

Vec vals(const Tree& t, const std::string& key) { return t.at(key).leaf().to_vector<double>(); }

TEST(NnModules, LinearMatchesReference) {
  for (bool bias : {true, false}) {
    Linear lin{.in = 5, .out = 3, .bias = bias};
    ParamScope scope(1, DType::Float64);
    Tree p = randomized(lin.init(scope), 2);
    EXPECT_EQ(p.size(), bias ? 2u : 1u);
    Array x = random_array({2, 4, 5}, 3);
    Vec b = bias ? vals(p, "b") : Vec{};
    Vec want = nn_ref::linear(x.to_vector<double>(), 8, 5, vals(p, "w"), 3, bias ? &b : nullptr);
    Array got = lin(p, x);
    EXPECT_SHAPE(got, 2, 4, 3);
    EXPECT_CLOSE(got, want, kTol, kTol);
    const ParamSpecs& specs = scope.specs();
    EXPECT_EQ(specs.at("w").axes, (AxisNames{"embed", "mlp"}));
    EXPECT_EQ(specs.at("w").kind, ParamKind::Weight);
    if (bias) {
      EXPECT_EQ(specs.at("b").kind, ParamKind::Bias);
    }
  }
}

TEST(NnModules, EmbeddingLooksUpAndAttends) {
  Embedding emb{.vocab = 7, .dim = 3};
  ParamScope scope(1, DType::Float64);
  Tree p = randomized(emb.init(scope), 4);
  Vec w = vals(p, "w");
  Array ids = Array::from_vector<int32_t>({6, 0, 3, 3}, {2, 2});
  Vec want;
  for (int id : {6, 0, 3, 3})
    for (int j = 0; j < 3; ++j) want.push_back(w[static_cast<size_t>(id * 3 + j)]);
  EXPECT_CLOSE(emb(p, ids), want, 0, 0);
  Array x = random_array({2, 3}, 5);
  Vec wt(21);
  for (int v = 0; v < 7; ++v)
    for (int j = 0; j < 3; ++j) wt[static_cast<size_t>(j * 7 + v)] = w[static_cast<size_t>(v * 3 + j)];
  EXPECT_CLOSE(emb.attend(p, x), nn_ref::linear(x.to_vector<double>(), 2, 3, wt, 7), kTol, kTol);
  EXPECT_EQ(scope.specs().at("w").kind, ParamKind::Embedding);
  EXPECT_EQ(scope.specs().at("w").axes, (AxisNames{"vocab", "embed"}));
}

TEST(NnModules, LayerNormAndRmsNormMatchReference) {
  Array x = random_array({3, 2, 6}, 6, DType::Float64, -2, 2);
  {
    LayerNorm ln{.dim = 6, .eps = 1e-5};
    ParamScope scope(1, DType::Float64);
    Tree init = ln.init(scope);
    EXPECT_EQ(vals(init, "scale"), Vec(6, 1.0));
    EXPECT_EQ(vals(init, "bias"), Vec(6, 0.0));
    EXPECT_EQ(scope.specs().at("scale").kind, ParamKind::Norm);
    EXPECT_EQ(scope.specs().at("bias").axes, (AxisNames{"norm"}));
    Tree p = randomized(init, 7);
    Vec bias = vals(p, "bias");
    EXPECT_CLOSE(ln(p, x), nn_ref::layer_norm(x.to_vector<double>(), 6, 6, vals(p, "scale"), &bias, 1e-5), 1e-9, 1e-9);
  }
  {
    RMSNorm rms{.dim = 6, .eps = 1e-6};
    ParamScope scope(1, DType::Float64);
    Tree p = randomized(rms.init(scope), 8);
    EXPECT_EQ(p.size(), 1u);
    EXPECT_EQ(scope.specs().at("scale").kind, ParamKind::Norm);
    EXPECT_CLOSE(rms(p, x), nn_ref::rms_norm(x.to_vector<double>(), 6, 6, vals(p, "scale"), 1e-6), 1e-9, 1e-9);
  }
}

TEST(NnModules, RotaryAtAnOffsetMatchesReference) {
  const int64_t d = 8;
  Rotary rotary{.head_dim = d, .theta = 500.0};
  Array x = random_array({2, 3, 5, d}, 9);  // [B, H, T, D]
  for (int64_t offset : {0, 7}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    Vec want = x.to_vector<double>();
    for (int64_t row = 0; row < 2 * 3 * 5; ++row)
      nn_ref::rope(&want[static_cast<size_t>(row * d)], d, offset + row % 5, 500.0);
    EXPECT_CLOSE(rotary(x, offset), want, kTol, kTol);
  }
  // Rotation preserves each head vector's norm; position 0 is the identity.
  EXPECT_CLOSE(rotary(slice_axis(x, 2, 0, 1), 0), slice_axis(x, 2, 0, 1).to_vector<double>(), 0, 0);
  EXPECT_THROW((Rotary{.head_dim = 8})(random_array({1, 6}, 1), 0), ShapeError);
  EXPECT_THROW((Rotary{.head_dim = 7}).tables(2, 0, DType::Float32), ValueError);
}

struct AttentionCase {
  int64_t heads, kv_heads;
  bool rope, bias;
};

TEST(NnModules, AttentionMatchesReference) {
  for (AttentionCase c : {AttentionCase{4, 4, false, true}, AttentionCase{4, 2, true, false},
                          AttentionCase{6, 1, true, true}, AttentionCase{2, 2, true, false}}) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + " kv " + std::to_string(c.kv_heads) + (c.rope ? " rope" : ""));
    const int64_t d = 24, b = 2, t = 5;
    Attention attn{
        .dim = d, .heads = c.heads, .kv_heads = c.kv_heads, .bias = c.bias, .rope = c.rope, .rope_theta = 100};
    ParamScope scope(3, DType::Float64);
    Tree p = randomized(attn.init(scope), 10);
    const int64_t width = (c.heads + 2 * c.kv_heads) * (d / c.heads);
    EXPECT_EQ(p.at("wqkv").leaf().shape(), (Shape{d, width}));
    EXPECT_EQ(scope.specs().at("wqkv").axes, (AxisNames{"embed", "heads"}));
    EXPECT_EQ(scope.specs().contains("bqkv"), c.bias);
    Array x = random_array({b, t, d}, 11);
    Vec bqkv = c.bias ? vals(p, "bqkv") : Vec{}, bo = c.bias ? vals(p, "bo") : Vec{};
    Vec want = nn_ref::attention(x.to_vector<double>(), b, t, d, c.heads, c.kv_heads, vals(p, "wqkv"),
                                 c.bias ? &bqkv : nullptr, vals(p, "wo"), c.bias ? &bo : nullptr, c.rope, 100);
    EXPECT_CLOSE(attn(p, x), want, 1e-9, 1e-9);

    // Incrementally: a 2-token prompt, a 2-token chunk (the end-aligned causal mask),
    // then one token at a time give the same rows.
    KVState cache;
    std::vector<Array> rows;
    for (auto [start, stop] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {4, 5}})
      rows.push_back(attn(p, slice_axis(x, 1, start, stop), &cache));
    EXPECT_EQ(cache.k.shape(), (Shape{b, c.kv_heads, t, d / c.heads}));
    EXPECT_CLOSE(concatenate(rows, 1), want, 1e-9, 1e-9);
  }
}

TEST(NnModules, AttentionRejectsBadShapes) {
  EXPECT_THROW((Attention{.dim = 10, .heads = 4}).validate(), ValueError);
  EXPECT_THROW((Attention{.dim = 12, .heads = 4, .kv_heads = 3}).validate(), ValueError);
  EXPECT_THROW((Attention{.dim = 12, .heads = 4, .rope = true}).validate(), ValueError);  // head_dim 3
  Attention attn{.dim = 8, .heads = 2};
  Tree p = attn.init(ParamScope(1));
  EXPECT_THROW(attn(p, zeros({2, 3, 6})), ShapeError);
  KVState bad{zeros({2, 2, 1, 3}), zeros({2, 2, 1, 3})};
  EXPECT_THROW(attn(p, zeros({2, 3, 8}), &bad), ShapeError);
}

TEST(NnModules, GeluMlpAndSwiGluMatchReference) {
  const int64_t d = 6, hidden = 10, rows = 4;
  Array x = random_array({2, 2, d}, 12, DType::Float64, -2, 2);
  const Vec xs = x.to_vector<double>();
  {
    GeluMLP mlp{.dim = d, .hidden = hidden, .out_std = 0.005};
    ParamScope scope(5, DType::Float64);
    Tree p = randomized(mlp.init(scope), 13);
    EXPECT_EQ(scope.specs().at("fc.w").axes, (AxisNames{"embed", "mlp"}));
    EXPECT_EQ(scope.specs().at("proj.w").axes, (AxisNames{"mlp", "embed"}));
    EXPECT_EQ(scope.specs().at("proj.w").init.stddev, 0.005);
    EXPECT_EQ(scope.specs().at("fc.b").kind, ParamKind::Bias);
    Vec b1 = p.at("fc").at("b").leaf().to_vector<double>(), b2 = p.at("proj").at("b").leaf().to_vector<double>();
    Vec h = nn_ref::linear(xs, rows, d, p.at("fc").at("w").leaf().to_vector<double>(), hidden, &b1);
    for (double& v : h) v = nn_ref::gelu_tanh(v);
    Vec want = nn_ref::linear(h, rows, hidden, p.at("proj").at("w").leaf().to_vector<double>(), d, &b2);
    EXPECT_CLOSE(mlp(p, x), want, 1e-9, 1e-9);
  }
  {
    SwiGLU mlp{.dim = d, .hidden = hidden};
    ParamScope scope(5, DType::Float64);
    Tree p = randomized(mlp.init(scope), 14);
    EXPECT_EQ(scope.specs().size(), 3u);  // no biases
    Vec gate = nn_ref::linear(xs, rows, d, p.at("gate").at("w").leaf().to_vector<double>(), hidden);
    Vec up = nn_ref::linear(xs, rows, d, p.at("up").at("w").leaf().to_vector<double>(), hidden);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = nn_ref::silu(gate[i]) * up[i];
    Vec want = nn_ref::linear(gate, rows, hidden, p.at("down").at("w").leaf().to_vector<double>(), d);
    EXPECT_CLOSE(mlp(p, x), want, 1e-9, 1e-9);
  }
}

TEST(NnModules, DropoutScalesKeptValuesAndIsOffWithoutAKey) {
  const int64_t n = 20000;
  Array x = random_array({n}, 15, DType::Float32, 0.5, 1.5);
  Dropout drop{.rate = 0.25};
  EXPECT_TRUE(drop(x, std::nullopt).is_same(x));
  EXPECT_TRUE((Dropout{.rate = 0}(x, key(1))).is_same(x));
  Array y = drop(x, key(3));
  Vec xs = x.to_vector<double>(), ys = y.to_vector<double>();
  int64_t zeros_seen = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (ys[i] == 0) {
      ++zeros_seen;
    } else {
      ASSERT_NEAR(ys[i], xs[i] / 0.75, 1e-6 * xs[i]) << "element " << i;
    }
  }
  // Binomial(20000, 0.25): standard deviation ~61; 6 sigma.
  EXPECT_NEAR(static_cast<double>(zeros_seen), 0.25 * n, 370);
  EXPECT_EQ(drop(x, key(3)).to_vector<float>(), y.to_vector<float>());  // deterministic in the key
  EXPECT_NE(drop(x, key(4)).to_vector<float>(), y.to_vector<float>());
  EXPECT_EQ((Dropout{.rate = 1}(x, key(1))).to_vector<float>(), std::vector<float>(n, 0.0f));
  EXPECT_THROW((Dropout{.rate = 1.5}(x, key(1))), ValueError);
  EXPECT_THROW((Dropout{.rate = -0.1}(x, std::nullopt)), ValueError);
}

TEST(NnParams, ScopeRecordsPathsAndSpecsOnlyAllocatesNothing) {
  Attention attn{.dim = 8, .heads = 2, .kv_heads = 1, .bias = false, .rope = true};
  ParamScope scope(7);
  Tree p = attn.init(scope.child("layers").child(size_t{0}).child("attn"));
  EXPECT_TRUE(scope.specs().contains("layers.0.attn.wqkv"));
  EXPECT_TRUE(scope.specs().contains("layers.0.attn.wo"));
  ParamScope specs_only = ParamScope::specs_only();
  Tree shapes = attn.init(specs_only.child("layers").child(size_t{0}).child("attn"));
  EXPECT_FALSE(shapes.at("wqkv").leaf().is_evaluated());
  ASSERT_EQ(specs_only.specs().size(), scope.specs().size());
  for (const auto& [path, info] : scope.specs()) {
    EXPECT_EQ(specs_only.specs().at(path).shape, info.shape) << path;
    EXPECT_EQ(specs_only.specs().at(path).axes, info.axes) << path;
  }
  // Same seed and path: bitwise the same values; the path alone decides the key.
  Tree again = attn.init(ParamScope(7).child("layers").child(size_t{0}).child("attn"));
  EXPECT_EQ(again.at("wqkv").leaf().to_vector<float>(), p.at("wqkv").leaf().to_vector<float>());
  Tree other = attn.init(ParamScope(7).child("layers").child(size_t{1}).child("attn"));
  EXPECT_NE(other.at("wqkv").leaf().to_vector<float>(), p.at("wqkv").leaf().to_vector<float>());
  EXPECT_THROW(attn.init(scope.child("layers").child(size_t{0}).child("attn")), ValueError);  // declared twice
}

}  // namespace
}  // namespace tessera::nn
