// Muon through Optimizer against a float64 reference: Nesterov momentum orthogonalized
// by Newton-Schulz for the hidden 2-D weights (scaled by 0.2 sqrt(max dim)), AdamW for
// the rest; and the Newton-Schulz iteration itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "optim/optim_test_util.h"
#include "optim/rules.h"
#include "tessera/core/ops.h"

namespace tessera::test {
namespace {

using optim::Optimizer;
using optim::OptimizerConfig;

using Matrix = std::vector<double>;  // row-major

Matrix matmul_ref(const Matrix& a, const Matrix& b, int64_t n, int64_t k, int64_t m) {
  Matrix out(static_cast<size_t>(n * m), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < m; ++j) out[i * m + j] += a[i * k + l] * b[l * m + j];
  return out;
}

Matrix transpose_ref(const Matrix& a, int64_t n, int64_t m) {
  Matrix out(a.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) out[j * n + i] = a[i * m + j];
  return out;
}

Matrix newton_schulz_ref(Matrix x, int64_t rows, int64_t cols, int steps) {
  const bool tall = rows > cols;
  if (tall) {
    x = transpose_ref(x, rows, cols);
    std::swap(rows, cols);
  }
  double norm = 0;
  for (double v : x) norm += v * v;
  norm = std::sqrt(norm) + 1e-7;
  for (double& v : x) v /= norm;
  for (int s = 0; s < steps; ++s) {
    Matrix a = matmul_ref(x, transpose_ref(x, rows, cols), rows, cols, rows);
    Matrix aa = matmul_ref(a, a, rows, rows, rows);
    Matrix poly(a.size());
    for (size_t i = 0; i < a.size(); ++i) poly[i] = -4.7750 * a[i] + 2.0315 * aa[i];
    Matrix px = matmul_ref(poly, x, rows, rows, cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 3.4445 * x[i] + px[i];
  }
  return tall ? transpose_ref(x, rows, cols) : x;
}

TEST(OptimMuon, NewtonSchulzMatchesReferenceAndIsNearlyOrthogonal) {
  const int64_t rows = 16, cols = 8;
  std::vector<double> g = random_values(rows * cols, 3);
  Array got = optim::detail::newton_schulz(Array::from_vector(g, {rows, cols}), 5);
  Matrix want = newton_schulz_ref(g, rows, cols, 5);
  std::vector<double> x = got.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(x[i], want[i], 2e-5) << i;
  // X^T X has eigenvalues in Newton-Schulz's band around 1 (its quintic maps every
  // singular value into roughly [0.7, 1.2]): the diagonal there, the rest small.
  Matrix xtx = matmul_ref(transpose_ref(x, rows, cols), x, cols, rows, cols);
  for (int64_t i = 0; i < cols; ++i) {
    EXPECT_GT(xtx[i * cols + i], 0.45) << i;
    EXPECT_LT(xtx[i * cols + i], 1.45) << i;
  }
}

// In bfloat16 (optimizer.muon_ns_dtype, as the speedruns run it): every product rounds
// to 8 significant bits, so the result drifts from the float64 iteration, but it keeps
// its direction and stays nearly orthogonal.
TEST(OptimMuon, NewtonSchulzInBfloat16StaysCloseAndNearlyOrthogonal) {
  const int64_t rows = 96, cols = 40;
  std::vector<double> g = random_values(rows * cols, 4);
  Array got = optim::detail::newton_schulz(Array::from_vector(g, {rows, cols}), 5, DType::BFloat16);
  ASSERT_EQ(got.dtype(), DType::BFloat16);
  Matrix want = newton_schulz_ref(g, rows, cols, 5);
  std::vector<double> x = astype(got, DType::Float64).to_vector<double>();
  // 15 GEMMs with 8-bit significands, and the quintic amplifies small singular values'
  // errors (its slope at 0 is 3.4): the iterate drifts by ~7% (measured on this matrix),
  // but stays pointed the same way as the float64 one (cosine > 0.99).
  double diff = 0, norm = 0, dot = 0, got_norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (x[i] - want[i]) * (x[i] - want[i]);
    norm += want[i] * want[i];
    dot += x[i] * want[i];
    got_norm += x[i] * x[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 0.15) << "relative Frobenius distance to the float64 iteration";
  EXPECT_GT(dot / std::sqrt(norm * got_norm), 0.99) << "cosine similarity to the float64 iteration";
  Matrix xtx = matmul_ref(transpose_ref(x, rows, cols), x, cols, rows, cols);
  for (int64_t i = 0; i < cols; ++i) {
    EXPECT_GT(xtx[i * cols + i], 0.45) << i;
    EXPECT_LT(xtx[i * cols + i], 1.45) << i;
  }
}

struct Moments {
  Values m, v;
};

void ref_muon_step(Values& p, Moments& st, Values g, const std::vector<LeafSpec>& leaves, const OptimizerConfig& c,
                   double lr, int64_t t) {
  ref_clip(g, c.clip_norm);
  for (const LeafSpec& l : leaves) {
    const double wd = ref_decays(l.kind) ? c.weight_decay : 0.0;
    std::vector<double>&pl = p[l.path], &ml = st.m[l.path];
    const std::vector<double>& gl = g.at(l.path);
    const bool orthogonal = l.kind == nn::ParamKind::Weight && l.shape.size() == 2;
    if (!orthogonal) {
      std::vector<double>& vl = st.v[l.path];
      for (size_t i = 0; i < pl.size(); ++i) {
        ml[i] = c.beta1 * ml[i] + (1 - c.beta1) * gl[i];
        vl[i] = c.beta2 * vl[i] + (1 - c.beta2) * gl[i] * gl[i];
        const double mhat = ml[i] / (1 - std::pow(c.beta1, static_cast<double>(t)));
        const double vhat = vl[i] / (1 - std::pow(c.beta2, static_cast<double>(t)));
        pl[i] -= lr * (mhat / (std::sqrt(vhat) + c.eps) + wd * pl[i]);
      }
      continue;
    }
    std::vector<double> direction(pl.size());
    for (size_t i = 0; i < pl.size(); ++i) {
      ml[i] = c.muon_momentum * ml[i] + gl[i];
      direction[i] = c.muon_nesterov ? gl[i] + c.muon_momentum * ml[i] : ml[i];
    }
    const int64_t rows = l.shape[0], cols = l.shape[1];
    Matrix o = newton_schulz_ref(direction, rows, cols, c.muon_ns_steps);
    const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
    for (size_t i = 0; i < pl.size(); ++i) pl[i] -= lr * (scale * o[i] + wd * pl[i]);
  }
}

void run_muon(bool nesterov) {
  std::vector<LeafSpec> leaves = test_leaves();  // head and layers.0.w orthogonalized; the rest AdamW
  OptimizerConfig config;
  config.name = "muon";
  config.muon_nesterov = nesterov;
  config.weight_decay = 0.1;
  config.clip_norm = 1.0;
  Optimizer opt(config, specs_of(leaves));
  Values p = random_values_for(leaves, 9, DType::Float64);
  Moments st;
  for (const LeafSpec& l : leaves) {
    st.m[l.path] = std::vector<double>(numel(l.shape), 0.0);
    st.v[l.path] = std::vector<double>(numel(l.shape), 0.0);
  }
  Tree params = tree_of(leaves, p, DType::Float64);
  Tree state = opt.init(params);
  EXPECT_EQ(state.at("v").at("head").leaf().shape(), Shape{}) << "orthogonalized matrices keep no second moment";
  EXPECT_EQ(state.at("v").at("emb").leaf().shape(), (Shape{5, 3}));
  EXPECT_EQ(opt.muon_mask(params), (std::vector<bool>{false, true, false, true, false}));
  for (int t = 1; t <= 3; ++t) {
    const double lr = 0.02;
    Values g = random_values_for(leaves, 500 + 10 * t, DType::Float64);
    Optimizer::Update u =
        opt.apply(params, tree_of(leaves, g, DType::Float64), state, Array::scalar(lr, DType::Float64));
    ref_muon_step(p, st, g, leaves, config, lr, t);
    params = u.params;
    state = u.state;
    // Newton-Schulz runs in float32: agreement to float32 rounding of the update.
    expect_close(values_of(params), p, 2e-6, "step " + std::to_string(t) + " params");
  }
}

TEST(OptimMuon, NesterovMatchesReference) { run_muon(true); }
TEST(OptimMuon, HeavyBallMatchesReference) { run_muon(false); }

TEST(OptimMuon, VocabularyMatricesAndVectorsUseAdamW) {
  nn::ParamInfo head{{64, 256}, DType::Float32, {"embed", "vocab"}, {}, nn::ParamKind::Weight};
  nn::ParamInfo hidden{{64, 256}, DType::Float32, {"embed", "mlp"}, {}, nn::ParamKind::Weight};
  nn::ParamInfo bias{{256}, DType::Float32, {"mlp"}, {}, nn::ParamKind::Bias};
  EXPECT_FALSE(optim::detail::muon_param(head, head.shape));
  EXPECT_TRUE(optim::detail::muon_param(hidden, hidden.shape));
  EXPECT_FALSE(optim::detail::muon_param(bias, bias.shape));
}

}  // namespace
}  // namespace tessera::test
