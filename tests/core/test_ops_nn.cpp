// Fused neural-network ops vs float64 naive references: softmax / log_softmax,
// layer_norm / rms_norm, scaled_dot_product_attention (materialized scores) and
// cross_entropy.
#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

// Softmax of x (shape s) along `axis` in float64.
std::vector<double> ref_softmax(const std::vector<double>& x, const Shape& s, int axis, bool log) {
  const int nd = static_cast<int>(s.size());
  if (axis < 0) axis += nd;
  auto mx =
      ref_reduce(x, s, {axis}, [](const std::vector<double>& g) { return *std::max_element(g.begin(), g.end()); });
  auto se = ref_reduce(x, s, {axis}, [](const std::vector<double>& g) {
    double m = *std::max_element(g.begin(), g.end()), t = 0;
    for (double v : g) t += std::exp(v - m);
    return std::log(t) + m;
  });
  (void)mx;
  Shape kept = ref_reduced_shape(s, {axis}, true);
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < numel(s); ++i) {
    auto idx = unravel(i, s);
    idx[axis] = 0;
    double l = x[i] - se[ravel(idx, kept)];
    out[i] = log ? l : std::exp(l);
  }
  return out;
}

double tol_for(DType dt) { return dt == DType::Float64 ? 1e-12 : dt == DType::Float32 ? 1e-5 : 2e-2; }

TEST(Softmax, AxesAndDtypes) {
  const std::vector<std::pair<Shape, int>> cases = {{{3, 7}, -1},    {{3, 7}, 0},  {{2, 5, 33}, -1}, {{2, 5, 4}, 1},
                                                    {{4, 1037}, -1}, {{1, 1}, -1}, {{0, 5}, -1}};
  uint32_t seed = 1;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const auto& [s, axis] : cases) {
      auto v = round_to(random_values(numel(s), seed++, -5, 5), dt);
      Array x = make_array(v, s, dt);
      Array y = softmax(x, axis), ly = log_softmax(x, axis);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.shape(), s);
      double t = tol_for(dt);
      EXPECT_TRUE(all_close(y, ref_softmax(v, s, axis, false), t, t * 0.01))
          << "softmax " << name(dt) << " " << to_string(s) << " axis " << axis;
      EXPECT_TRUE(all_close(ly, ref_softmax(v, s, axis, true), t, t))
          << "log_softmax " << name(dt) << " " << to_string(s) << " axis " << axis;
    }
  }
  // Large logits do not overflow.
  Array big = make_array({1000, 999, -1000}, {3}, DType::Float32);
  EXPECT_CLOSE(softmax(big), ref_softmax({1000, 999, -1000}, {3}, 0, false), 1e-6, 1e-30);
  EXPECT_CLOSE(log_softmax(big), ref_softmax({1000, 999, -1000}, {3}, 0, true), 1e-6, 1e-4);
}

std::vector<double> ref_norm(const std::vector<double>& x, int64_t rows, int64_t D, const std::vector<double>* w,
                             const std::vector<double>* b, double eps, bool rms) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * D];
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < D; ++j) mean += xr[j];
      mean /= static_cast<double>(D);
    }
    for (int64_t j = 0; j < D; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(D);
    double inv = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < D; ++j) {
      double t = (xr[j] - mean) * inv;
      if (w) t *= (*w)[j];
      if (b) t += (*b)[j];
      y[r * D + j] = t;
    }
  }
  return y;
}

TEST(Norms, LayerNormAndRmsNorm) {
  const std::vector<Shape> shapes = {{4, 7}, {2, 3, 33}, {1, 1}, {5, 1037}, {0, 8}};
  uint32_t seed = 10;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const Shape& s : shapes) {
      int64_t D = s.back(), rows = numel(s) / std::max<int64_t>(D, 1);
      if (D == 0) rows = 0;
      auto v = round_to(random_values(numel(s), seed++, -2, 3), dt);
      auto w = round_to(random_values(D, seed++, 0.5, 1.5), dt), b = round_to(random_values(D, seed++), dt);
      Array x = make_array(v, s, dt), wa = make_array(w, {D}, dt), ba = make_array(b, {D}, dt);
      double t = tol_for(dt) * (dt == DType::Float32 ? 4 : 1);
      for (int variant = 0; variant < 3; ++variant) {
        std::optional<Array> ow = variant >= 1 ? std::optional<Array>(wa) : std::nullopt;
        std::optional<Array> ob = variant == 2 ? std::optional<Array>(ba) : std::nullopt;
        Array y = layer_norm(x, ow, ob, 1e-5);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_EQ(y.shape(), s);
        EXPECT_TRUE(all_close(y, ref_norm(v, rows, D, ow ? &w : nullptr, ob ? &b : nullptr, 1e-5, false), t, t))
            << "layer_norm " << name(dt) << " " << to_string(s) << " variant " << variant;
      }
      for (bool with_w : {false, true}) {
        Array y = rms_norm(x, with_w ? std::optional<Array>(wa) : std::nullopt, 1e-6);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(all_close(y, ref_norm(v, rows, D, with_w ? &w : nullptr, nullptr, 1e-6, true), t, t))
            << "rms_norm " << name(dt) << " " << to_string(s) << " weight " << with_w;
      }
    }
  }
  // eps matters for a constant row: layer_norm gives 0, not NaN.
  Array c = full({2, 4}, 3.0, DType::Float32);
  EXPECT_CLOSE(layer_norm(c), std::vector<double>(8, 0), 0, 1e-6);
}

// Naive attention with materialized scores. mask (may be empty) has shape ms,
// broadcast to [B, H, T, S]; a fully masked row gives 0.
std::vector<double> ref_attention(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S,
                                  int64_t D, bool causal, const std::vector<double>& mask, const Shape& ms,
                                  double scale) {
  std::vector<double> out(static_cast<size_t>(B * H * T * D), 0.0);
  const Shape full_s = {B, H, T, S};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t hk = h / (H / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> sc(S);
        std::vector<bool> ok(S);
        double m = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          ok[s] = !(causal && s > t);
          if (!mask.empty()) ok[s] = ok[s] && mask[broadcast_index({b, h, t, s}, ms, full_s)] != 0;
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += q[((b * H + h) * T + t) * D + d] * k[((b * Hkv + hk) * S + s) * D + d];
          sc[s] = acc * scale;
          if (ok[s]) m = std::max(m, sc[s]);
        }
        if (m == -INFINITY) continue;
        double z = 0;
        for (int64_t s = 0; s < S; ++s) z += ok[s] ? std::exp(sc[s] - m) : 0;
        for (int64_t s = 0; s < S; ++s) {
          if (!ok[s]) continue;
          double p = std::exp(sc[s] - m) / z;
          for (int64_t d = 0; d < D; ++d) out[((b * H + h) * T + t) * D + d] += p * v[((b * Hkv + hk) * S + s) * D + d];
        }
      }
    }
  return out;
}

struct AttnCase {
  int64_t B, H, Hkv, T, S, D;
  bool causal;
  Shape mask_shape;  // empty: no mask
};

TEST(Attention, VsNaive) {
  const std::vector<AttnCase> cases = {
      {1, 1, 1, 1, 1, 8, true, {}},
      {2, 2, 2, 7, 7, 8, true, {}},
      {2, 2, 2, 7, 7, 8, false, {}},
      {1, 4, 2, 9, 9, 8, true, {}},
      {1, 4, 2, 5, 11, 8, false, {}},
      {2, 2, 1, 6, 3, 8, false, {}},
      {2, 2, 2, 6, 6, 8, false, {2, 1, 6, 6}},
      {1, 4, 2, 5, 7, 8, false, {7}},
      {1, 2, 2, 70, 70, 16, true, {}},
      {2, 4, 2, 8, 8, 8, true, {1, 4, 8, 8}},
      {1, 2, 1, 40, 67, 8, false, {1, 1, 40, 67}},
  };
  uint32_t seed = 100;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const auto& c : cases) {
      auto q = round_to(random_values(c.B * c.H * c.T * c.D, seed++, -2, 2), dt);
      auto k = round_to(random_values(c.B * c.Hkv * c.S * c.D, seed++, -2, 2), dt);
      auto v = round_to(random_values(c.B * c.Hkv * c.S * c.D, seed++), dt);
      std::vector<double> mv;
      std::optional<Array> mask;
      if (!c.mask_shape.empty()) {
        auto bits = random_ints(numel(c.mask_shape), seed++, 0, 3);  // 3/4 attend
        std::vector<bool> mb;
        for (auto x : bits) mv.push_back(x != 0), mb.push_back(x != 0);
        mv[0] = 0, mb[0] = false;
        if (numel(c.mask_shape) > c.mask_shape.back())  // one fully masked row
          for (int64_t s = 0; s < c.mask_shape.back(); ++s) mv[s] = 0, mb[s] = false;
        mask = Array::from_vector<bool>(mb, c.mask_shape);
      }
      Array out = scaled_dot_product_attention(make_array(q, {c.B, c.H, c.T, c.D}, dt),
                                               make_array(k, {c.B, c.Hkv, c.S, c.D}, dt),
                                               make_array(v, {c.B, c.Hkv, c.S, c.D}, dt), c.causal, mask);
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_EQ(out.shape(), (Shape{c.B, c.H, c.T, c.D}));
      auto e = ref_attention(q, k, v, c.B, c.H, c.Hkv, c.T, c.S, c.D, c.causal, mv, c.mask_shape,
                             1 / std::sqrt(static_cast<double>(c.D)));
      double t = tol_for(dt) * (dt == DType::Float32 ? 10 : 1);
      EXPECT_TRUE(all_close(out, e, t, t))
          << name(dt) << " B" << c.B << " H" << c.H << " Hkv" << c.Hkv << " T" << c.T << " S" << c.S << " causal "
          << c.causal << " mask " << to_string(c.mask_shape);
    }
  }
  // Explicit scale.
  auto q = random_values(2 * 3 * 4, 7), k = random_values(2 * 5 * 4, 8), v = random_values(2 * 5 * 4, 9);
  Array o = scaled_dot_product_attention(make_array(q, {1, 2, 3, 4}), make_array(k, {1, 2, 5, 4}),
                                         make_array(v, {1, 2, 5, 4}), false, std::nullopt, 0.7);
  EXPECT_CLOSE(o, ref_attention(q, k, v, 1, 2, 2, 3, 5, 4, false, {}, {}, 0.7), 1e-12, 1e-12);
}

// loss per row and its reduction in float64.
std::vector<double> ref_ce(const std::vector<double>& logits, const std::vector<int64_t>& targets, int64_t V,
                           int64_t ignore, Reduction red) {
  const int64_t R = static_cast<int64_t>(targets.size());
  std::vector<double> loss(R, 0.0);
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] == ignore) continue;
    ++count;
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, logits[r * V + j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(logits[r * V + j] - m);
    loss[r] = std::log(z) + m - logits[r * V + targets[r]];
  }
  if (red == Reduction::None) return loss;
  double total = 0;
  for (double l : loss) total += l;
  if (red == Reduction::Sum) return {total};
  return {count == 0 ? 0.0 : total / static_cast<double>(count)};
}

TEST(CrossEntropy, ReductionsIgnoreIndexDtypes) {
  const int64_t B = 3, T = 5, V = 33;
  uint32_t seed = 200;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    auto lv = round_to(random_values(B * T * V, seed++, -4, 4), dt);
    auto tg = random_ints(B * T, seed++, 0, V - 1);
    tg[2] = -100, tg[7] = -100;
    Array logits = make_array(lv, {B, T, V}, dt);
    Array targets = Array::from_vector<int64_t>(tg, {B, T});
    DType out_dt = dt == DType::Float64 ? DType::Float64 : DType::Float32;
    double t = dt == DType::Float64 ? 1e-12 : 1e-5;
    Array none = cross_entropy(logits, targets, -100, Reduction::None);
    EXPECT_EQ(none.dtype(), out_dt) << name(dt);
    EXPECT_SHAPE(none, B, T);
    EXPECT_CLOSE(none, ref_ce(lv, tg, V, -100, Reduction::None), t, t);
    Array s = cross_entropy(logits, targets, -100, Reduction::Sum);
    EXPECT_EQ(s.ndim(), 0);
    EXPECT_EQ(s.dtype(), out_dt);
    EXPECT_CLOSE(s, ref_ce(lv, tg, V, -100, Reduction::Sum), t, t);
    Array m = cross_entropy(logits, targets);
    EXPECT_EQ(m.dtype(), out_dt);
    EXPECT_CLOSE(m, ref_ce(lv, tg, V, -100, Reduction::Mean), t, t);
  }
  // int32 targets, 2-D logits, a custom ignore_index.
  auto lv = random_values(4 * 7, 9);
  std::vector<int64_t> tg = {3, 0, 6, 3};
  Array l2 = make_array(lv, {4, 7});
  Array t32 = Array::from_vector<int32_t>({3, 0, 6, 3}, {4});
  EXPECT_CLOSE(cross_entropy(l2, t32, 0, Reduction::Mean), ref_ce(lv, tg, 7, 0, Reduction::Mean), 1e-12, 1e-12);
  // All ignored: mean is 0, not NaN.
  Array all_ignored = Array::from_vector<int64_t>({-100, -100, -100, -100}, {4});
  EXPECT_EQ(cross_entropy(l2, all_ignored).item<double>(), 0.0);
  EXPECT_EQ(cross_entropy(l2, all_ignored, -100, Reduction::Sum).item<double>(), 0.0);
  // Large vocabulary (vector tails) in float32.
  const int64_t Vb = small_tests() ? 1037 : 50257;
  auto lb = round_to(random_values(2 * Vb, 10, -3, 3), DType::Float32);
  std::vector<int64_t> tb = {5, Vb - 1};
  EXPECT_CLOSE(cross_entropy(make_array(lb, {2, Vb}, DType::Float32), Array::from_vector<int64_t>(tb, {2}), -100,
                             Reduction::None),
               ref_ce(lb, tb, Vb, -100, Reduction::None), 1e-5, 1e-5);
}

}  // namespace
}  // namespace tessera::test
