// vmap batching rules vs a loop over the batch (call the function per example on
// host-sliced inputs, assemble the results on the host): every op family, in_axes
// != 0, kNotMapped inputs, out_axes, and per-example gradients vmap(grad(f)).
#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

// Example i of x along `axis` as a fresh leaf (host slicing: independent of the code
// under test).
Array example(const Array& x, int axis, int64_t i) {
  auto v = values(x);
  Shape s = x.shape(), es = s;
  es.erase(es.begin() + axis);
  std::vector<double> out(static_cast<size_t>(numel(es)));
  for (int64_t j = 0; j < numel(es); ++j) {
    auto idx = unravel(j, es);
    idx.insert(idx.begin() + axis, i);
    out[j] = v[ravel(idx, s)];
  }
  return make_array(out, es, x.dtype());
}

// Compares vmap(f, in_axes, out_axes)(inputs) with the per-example loop.
::testing::AssertionResult check_vmap(const ArrayFn& f, const std::vector<Array>& inputs, std::vector<int> in_axes = {},
                                      std::vector<int> out_axes = {}, double rtol = 1e-12, double atol = 1e-13) {
  if (in_axes.empty()) in_axes.assign(inputs.size(), 0);
  int64_t B = -1;
  for (size_t j = 0; j < inputs.size(); ++j)
    if (in_axes[j] != kNotMapped) B = inputs[j].shape(in_axes[j]);
  std::vector<std::vector<Array>> per;  // per[i][o]
  for (int64_t i = 0; i < B; ++i) {
    std::vector<Array> ex;
    for (size_t j = 0; j < inputs.size(); ++j)
      ex.push_back(in_axes[j] == kNotMapped ? inputs[j] : example(inputs[j], in_axes[j], i));
    per.push_back(f(ex));
  }
  std::vector<Array> batched = vmap(f, in_axes, out_axes)(inputs);
  if (batched.size() != per[0].size())
    return ::testing::AssertionFailure() << "vmap gave " << batched.size() << " outputs, f gives " << per[0].size();
  for (size_t o = 0; o < batched.size(); ++o) {
    int oa = out_axes.empty() ? 0 : out_axes[o];
    Shape es = per[0][o].shape();
    if (oa < 0) oa += static_cast<int>(es.size()) + 1;
    es.insert(es.begin() + oa, B);
    if (batched[o].shape() != es)
      return ::testing::AssertionFailure()
             << "output " << o << " has shape " << to_string(batched[o].shape()) << ", expected " << to_string(es);
    if (batched[o].dtype() != per[0][o].dtype())
      return ::testing::AssertionFailure()
             << "output " << o << " dtype " << name(batched[o].dtype()) << ", expected " << name(per[0][o].dtype());
    std::vector<std::vector<double>> pv;
    for (int64_t i = 0; i < B; ++i) pv.push_back(values(per[i][o]));
    std::vector<double> expected(static_cast<size_t>(numel(es)));
    for (int64_t j = 0; j < numel(es); ++j) {
      auto idx = unravel(j, es);
      int64_t i = idx[oa];
      idx.erase(idx.begin() + oa);
      expected[j] = pv[i][ravel(idx, per[0][o].shape())];
    }
    auto r = all_close(batched[o], expected, rtol, atol);
    if (!r) return ::testing::AssertionFailure() << "output " << o << ": " << r.message();
  }
  return ::testing::AssertionSuccess();
}

ArrayFn one(std::function<Array(const std::vector<Array>&)> f) {
  return [f](const std::vector<Array>& xs) { return std::vector<Array>{f(xs)}; };
}

TEST(Vmap, UnaryAndBinaryOps) {
  const std::vector<std::pair<const char*, std::function<Array(const Array&)>>> unary = {
      {"negative", [](const Array& a) { return negative(a); }},
      {"abs", [](const Array& a) { return abs(a); }},
      {"exp", [](const Array& a) { return exp(a); }},
      {"log", [](const Array& a) { return log(abs(a) + 1.0); }},
      {"tanh", [](const Array& a) { return tanh(a); }},
      {"gelu", [](const Array& a) { return gelu(a); }},
      {"relu", [](const Array& a) { return relu(a); }},
      {"sigmoid", [](const Array& a) { return sigmoid(a); }},
      {"silu", [](const Array& a) { return silu(a); }},
      {"sqrt", [](const Array& a) { return sqrt(square(a)); }},
      {"erf", [](const Array& a) { return erf(a); }},
      {"sin/cos", [](const Array& a) { return sin(a) * cos(a); }},
      {"astype", [](const Array& a) { return astype(a, DType::Float32); }},
      {"scalar_ops", [](const Array& a) { return 2.0 * a + 1.0; }},
  };
  Array x = random_array({4, 3, 5}, 1);
  for (const auto& [n, op] : unary) {
    auto f = one([op = op](const std::vector<Array>& xs) { return op(xs[0]); });
    EXPECT_TRUE(check_vmap(f, {x}, {0}, {}, 1e-6, 1e-7)) << n;
    EXPECT_TRUE(check_vmap(f, {x}, {1}, {}, 1e-6, 1e-7)) << n << " in_axes 1";
    EXPECT_TRUE(check_vmap(f, {x}, {2}, {1}, 1e-6, 1e-7)) << n << " in_axes 2, out_axes 1";
  }
  const std::vector<std::pair<const char*, std::function<Array(const Array&, const Array&)>>> binary = {
      {"add", [](const Array& a, const Array& b) { return add(a, b); }},
      {"subtract", [](const Array& a, const Array& b) { return a - b; }},
      {"multiply", [](const Array& a, const Array& b) { return multiply(a, b); }},
      {"divide", [](const Array& a, const Array& b) { return divide(a, b); }},
      {"power", [](const Array& a, const Array& b) { return power(abs(a) + 0.5, b); }},
      {"maximum", [](const Array& a, const Array& b) { return maximum(a, b); }},
      {"minimum", [](const Array& a, const Array& b) { return minimum(a, b); }},
      {"less", [](const Array& a, const Array& b) { return less(a, b); }},
      {"equal", [](const Array& a, const Array& b) { return equal(a, b); }},
      {"where", [](const Array& a, const Array& b) { return where(greater(a, b), a, b * 2.0); }},
      {"logical_or", [](const Array& a, const Array& b) { return logical_or(less(a, 0.0 * a), greater(b, 0.0 * b)); }},
  };
  Array a = random_array({4, 3, 5}, 2), b5 = random_array({4, 5}, 3), bshared = random_array({3, 1}, 4);
  Array b41 = random_array({4, 1}, 60), b35 = random_array({3, 5}, 61);
  for (const auto& [n, op] : binary) {
    auto f = one([op = op](const std::vector<Array>& xs) { return op(xs[0], xs[1]); });
    EXPECT_TRUE(check_vmap(f, {a, b5})) << n << " [3,5] with [5] per example";
    EXPECT_TRUE(check_vmap(f, {a, bshared}, {0, kNotMapped})) << n << " unmapped b";
    EXPECT_TRUE(check_vmap(f, {b41, a}, {kNotMapped, 1})) << n << " unmapped a, in_axes 1";
    EXPECT_TRUE(check_vmap(f, {a, b35}, {2, 1}, {-1})) << n << " in_axes (2, 1), out_axes -1";
  }
}

TEST(Vmap, Reductions) {
  Array x = random_array({3, 4, 5}, 5, DType::Float64, 0.5, 1.5);
  for (std::vector<int> axes : std::vector<std::vector<int>>{{}, {0}, {-1}, {0, 1}}) {
    for (bool keep : {false, true}) {
      std::string w = "axes " + to_string(Shape(axes.begin(), axes.end())) + (keep ? " keepdims" : "");
      for (int in_axis : {0, 2}) {
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return sum(xs[0], axes, keep); }), {x}, {in_axis}))
            << "sum " << w;
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return mean(xs[0], axes, keep); }), {x}, {in_axis}))
            << "mean " << w;
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return max(xs[0], axes, keep); }), {x}, {in_axis}))
            << "max " << w;
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return min(xs[0], axes, keep); }), {x}, {in_axis}))
            << "min " << w;
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return prod(xs[0], axes, keep); }), {x}, {in_axis}))
            << "prod " << w;
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return logsumexp(xs[0], axes, keep); }), {x}, {in_axis}))
            << "logsumexp " << w;
        EXPECT_TRUE(
            check_vmap(one([=](const std::vector<Array>& xs) { return var(xs[0], axes, keep); }), {x}, {in_axis}))
            << "var " << w;
      }
    }
  }
  for (int axis : {0, -1}) {
    EXPECT_TRUE(check_vmap(one([=](const std::vector<Array>& xs) { return argmax(xs[0], axis); }), {x}, {1}))
        << "argmax " << axis;
    EXPECT_TRUE(check_vmap(one([=](const std::vector<Array>& xs) { return argmin(xs[0], axis, true); }), {x}))
        << "argmin " << axis;
  }
}

TEST(Vmap, MatmulAndDotGeneral) {
  Array a = random_array({3, 4, 5}, 6), b = random_array({3, 5, 2}, 7), w = random_array({5, 2}, 8);
  auto mm = one([](const std::vector<Array>& xs) { return matmul(xs[0], xs[1]); });
  EXPECT_TRUE(check_vmap(mm, {a, b})) << "both mapped";
  EXPECT_TRUE(check_vmap(mm, {a, w}, {0, kNotMapped})) << "weights shared";
  EXPECT_TRUE(check_vmap(mm, {random_array({4, 5}, 9), b}, {kNotMapped, 0})) << "lhs shared";
  EXPECT_TRUE(check_vmap(mm, {a, random_array({5, 3, 2}, 10)}, {0, 1}, {2})) << "in_axes (0, 1), out_axes 2";
  EXPECT_TRUE(check_vmap(mm, {random_array({3, 5}, 11), w}, {0, kNotMapped})) << "vector @ matrix per example";
  auto dg = one([](const std::vector<Array>& xs) { return dot_general(xs[0], xs[1], {2}, {1}, {0}, {0}); });
  EXPECT_TRUE(check_vmap(dg, {random_array({3, 2, 4, 5}, 12), random_array({3, 2, 5, 6}, 13)}));
  auto dg2 = one([](const std::vector<Array>& xs) { return dot_general(xs[0], xs[1], {0}, {1}); });
  EXPECT_TRUE(check_vmap(dg2, {random_array({4, 3, 2}, 14), random_array({2, 4}, 15)}, {1, kNotMapped}));
}

TEST(Vmap, LayoutAndIndexing) {
  Array x = random_array({3, 2, 4, 6}, 20);
  const std::vector<std::pair<const char*, std::function<Array(const Array&)>>> cases = {
      {"reshape",
       [](const Array& a) {
         return reshape(a, {-1, 3});
       }},
      {"transpose",
       [](const Array& a) {
         return transpose(a, {1, 2, 0});
       }},
      {"swapaxes", [](const Array& a) { return swapaxes(a, 0, -1); }},
      {"moveaxis", [](const Array& a) { return moveaxis(a, -1, 0); }},
      {"expand_dims", [](const Array& a) { return expand_dims(a, -1); }},
      {"squeeze", [](const Array& a) { return squeeze(expand_dims(a, 1), {1}); }},
      {"broadcast_to",
       [](const Array& a) {
         return broadcast_to(slice_axis(a, 0, 0, 1), {5, 4, 6});
       }},
      {"slice",
       [](const Array& a) {
         return slice(a, {0, 1, 0}, {2, 4, 6}, {1, 2, 3});
       }},
      {"slice_axis", [](const Array& a) { return slice_axis(a, -1, 1, 6, 2); }},
      {"concatenate",
       [](const Array& a) {
         return concatenate({a, a * 2.0}, -1);
       }},
      {"stack",
       [](const Array& a) {
         return stack({a, -a}, 1);
       }},
      {"flatten", [](const Array& a) { return flatten(a); }},
      {"softmax", [](const Array& a) { return softmax(a, -1); }},
      {"softmax0", [](const Array& a) { return softmax(a, 0); }},
      {"log_softmax", [](const Array& a) { return log_softmax(a, 1); }},
      {"layer_norm", [](const Array& a) { return layer_norm(a); }},
      {"rms_norm", [](const Array& a) { return rms_norm(a); }},
  };
  for (const auto& [n, op] : cases) {
    auto f = one([op = op](const std::vector<Array>& xs) { return op(xs[0]); });
    EXPECT_TRUE(check_vmap(f, {x})) << n;
    EXPECT_TRUE(check_vmap(f, {x}, {1}, {-1})) << n << " in_axes 1, out_axes -1";
  }
  // Norm weights shared or per example.
  Array w = random_array({6}, 21), b = random_array({6}, 22);
  auto ln = one([](const std::vector<Array>& xs) { return layer_norm(xs[0], xs[1], xs[2]); });
  EXPECT_TRUE(check_vmap(ln, {x, w, b}, {0, kNotMapped, kNotMapped}));
  EXPECT_TRUE(check_vmap(ln, {x, random_array({3, 6}, 23), b}, {0, 0, kNotMapped}));
  auto rn = one([](const std::vector<Array>& xs) { return rms_norm(xs[0], xs[1]); });
  EXPECT_TRUE(check_vmap(rn, {x, random_array({6, 3}, 24)}, {0, 1}));

  // take: mapped table / mapped indices / both.
  Array table = random_array({3, 7, 4}, 25);
  Array ids = Array::from_vector<int64_t>(random_ints(3 * 5, 26, -7, 6), {3, 5});
  auto tk = one([](const std::vector<Array>& xs) { return take(xs[0], xs[1], 0); });
  EXPECT_TRUE(check_vmap(tk, {table, ids})) << "take both mapped";
  EXPECT_TRUE(check_vmap(tk, {example(table, 0, 0), ids}, {kNotMapped, 0})) << "take shared table";
  EXPECT_TRUE(check_vmap(tk, {table, example(ids, 0, 1)}, {0, kNotMapped})) << "take shared ids";
  auto tk1 = one([](const std::vector<Array>& xs) { return take(xs[0], xs[1], 1); });
  Array ids4 = Array::from_vector<int64_t>(random_ints(3 * 5, 29, -4, 3), {3, 5});
  EXPECT_TRUE(check_vmap(tk1, {table, ids4}, {0, 0})) << "take axis 1";
  Array along = Array::from_vector<int64_t>(random_ints(3 * 7 * 2, 27, 0, 3), {3, 7, 2});
  auto ta = one([](const std::vector<Array>& xs) { return take_along_axis(xs[0], xs[1], 1); });
  EXPECT_TRUE(check_vmap(ta, {table, along})) << "take_along_axis";
  auto oh = one([](const std::vector<Array>& xs) { return one_hot(xs[0], 7); });
  EXPECT_TRUE(check_vmap(oh, {Array::from_vector<int64_t>(random_ints(12, 28, 0, 6), {3, 4})}, {1})) << "one_hot";
}

TEST(Vmap, AttentionAndCrossEntropy) {
  // A batch of 3 examples of [1, H, T, D] attention (GQA: H = 4, Hkv = 2; T = 5, S = 6).
  Array q = random_array({3, 1, 4, 5, 8}, 30), k = random_array({3, 1, 2, 6, 8}, 31),
        v = random_array({3, 1, 2, 6, 8}, 32);
  for (bool causal : {true, false}) {
    auto at = one(
        [causal](const std::vector<Array>& xs) { return scaled_dot_product_attention(xs[0], xs[1], xs[2], causal); });
    EXPECT_TRUE(check_vmap(at, {q, k, v})) << "attention causal " << causal;
    EXPECT_TRUE(check_vmap(at, {q, example(k, 0, 0), example(v, 0, 1)}, {0, kNotMapped, kNotMapped}))
        << "attention shared kv, causal " << causal;
  }
  Array mask = Array::from_vector<bool>(
      [] {
        std::vector<bool> m;
        for (auto b : random_ints(3 * 5 * 6, 33, 0, 2)) m.push_back(b != 0);
        return m;
      }(),
      {3, 1, 1, 5, 6});
  auto atm =
      one([](const std::vector<Array>& xs) { return scaled_dot_product_attention(xs[0], xs[1], xs[2], false, xs[3]); });
  EXPECT_TRUE(check_vmap(atm, {q, k, v, mask})) << "attention with per-example mask";
  // Segment ids [1, T] (self-attention, T == S = 6), per example or shared.
  Array qs = random_array({3, 1, 4, 6, 8}, 35);
  Array ids = Array::from_vector<int32_t>({0, 0, 1, 1, 1, 2, 0, 1, 1, 1, 1, 1, 3, 3, 3, 0, 0, 0}, {3, 1, 6});
  auto ats = one([](const std::vector<Array>& xs) {
    return scaled_dot_product_attention(xs[0], xs[1], xs[2], true, std::nullopt, std::nullopt, xs[3]);
  });
  EXPECT_TRUE(check_vmap(ats, {qs, k, v, ids})) << "attention with per-example segment ids";
  EXPECT_TRUE(check_vmap(ats, {qs, k, v, example(ids, 0, 2)}, {0, 0, 0, kNotMapped}))
      << "attention with shared segment ids";

  Array logits = random_array({4, 3, 7}, 34);
  Array targets = Array::from_vector<int64_t>({0, 6, -100, 3, 3, 1, -100, -100, -100, 2, 5, 4}, {4, 3});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    auto ce = one([r](const std::vector<Array>& xs) { return cross_entropy(xs[0], xs[1], -100, r); });
    EXPECT_TRUE(check_vmap(ce, {logits, targets})) << "cross_entropy " << static_cast<int>(r);
  }
}

TEST(Vmap, MultipleOutputsAndNesting) {
  ArrayFn f = [](const std::vector<Array>& xs) {
    Array h = matmul(xs[0], xs[1]);
    return std::vector<Array>{sum(h), tanh(h)};
  };
  Array a = random_array({3, 2, 4}, 40), w = random_array({4, 5}, 41);
  EXPECT_TRUE(check_vmap(f, {a, w}, {0, kNotMapped}, {0, 2}));
  // vmap of vmap: an outer batch over an inner batch.
  ArrayFn inner = vmap(f, {0, kNotMapped});
  EXPECT_TRUE(check_vmap(inner, {random_array({2, 3, 2, 4}, 42), w}, {0, kNotMapped}));
}

TEST(Vmap, PerExampleGradients) {
  // Per-example gradient of a linear-softmax classifier: vmap(grad(loss)) over (x, y).
  Array wts = random_array({4, 3}, 50);
  Array xs = random_array({6, 2, 4}, 51);
  Array ys = Array::from_vector<int64_t>(random_ints(12, 52, 0, 2), {6, 2});
  ScalarFn loss = [](const std::vector<Array>& in) { return cross_entropy(tanh(matmul(in[1], in[0])), in[2]); };
  auto g = grad(loss, {0});
  ArrayFn per_example = [g](const std::vector<Array>& in) { return g(in); };
  EXPECT_TRUE(check_vmap(per_example, {wts, xs, ys}, {kNotMapped, 0, 0}, {}, 1e-11, 1e-13));
  // Mapped parameters too (an ensemble), and grad w.r.t. the inputs.
  ScalarFn loss2 = [](const std::vector<Array>& in) { return sum(square(gelu(matmul(in[0], in[1])))); };
  ArrayFn g2 = [loss2](const std::vector<Array>& in) { return grad(loss2)(in); };
  EXPECT_TRUE(check_vmap(g2, {random_array({5, 2, 3}, 53), random_array({5, 3, 2}, 54)}, {}, {}, 1e-11, 1e-13));
  EXPECT_TRUE(
      check_vmap(g2, {random_array({2, 3}, 55), random_array({3, 2, 5}, 56)}, {kNotMapped, 2}, {0, 1}, 1e-11, 1e-13));
}

}  // namespace
}  // namespace tessera::test

namespace tessera::test {
namespace {

TEST(Vmap, PerExampleAttentionGradients) {
  // vmap(grad) through the fused attention backward (folded into the attention
  // batch), with and without a shared mask, against a loop of grads.
  Array q = random_array({3, 1, 4, 5, 8}, 60), k = random_array({3, 1, 2, 5, 8}, 61),
        v = random_array({3, 1, 2, 5, 8}, 62);
  Array mask = Array::from_vector<bool>(
      [] {
        std::vector<bool> m;
        for (auto b : random_ints(5 * 5, 63, 0, 3)) m.push_back(b != 0);
        return m;
      }(),
      {5, 5});
  for (bool masked : {false, true}) {
    ScalarFn loss = [masked, mask](const std::vector<Array>& in) {
      std::optional<Array> m;
      if (masked) m = mask;
      return sum(square(scaled_dot_product_attention(in[0], in[1], in[2], true, m)));
    };
    ArrayFn g = [loss](const std::vector<Array>& in) { return grad(loss)(in); };
    EXPECT_TRUE(check_vmap(g, {q, k, v}, {}, {}, 1e-11, 1e-13)) << "masked " << masked;
  }
  // Per-example segment ids through the fused backward (AttentionGrad's batching rule).
  Array ids = Array::from_vector<int32_t>({0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 2, 2, 1, 1, 2}, {3, 1, 5});
  ScalarFn loss = [](const std::vector<Array>& in) {
    return sum(square(scaled_dot_product_attention(in[0], in[1], in[2], true, std::nullopt, std::nullopt, in[3])));
  };
  ArrayFn g = [loss](const std::vector<Array>& in) {
    std::vector<Array> grads = grad(loss, {0, 1, 2})(in);
    return grads;
  };
  EXPECT_TRUE(check_vmap(g, {q, k, v, ids}, {}, {}, 1e-11, 1e-13)) << "segment ids";
}

}  // namespace
}  // namespace tessera::test
