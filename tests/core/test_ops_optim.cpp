// adamw_update: the fused kernel against a float64 loop of the formula, over several
// steps, for float64/float32 and low-precision params with float32 state; errors;
// batching; meta-gradients through the composite.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

struct RefState {
  std::vector<double> p, m, v;
};

// The formula of docs and the header, in float64.
void reference_step(RefState& s, const std::vector<double>& g, const AdamWConfig& c) {
  double c1 = 1.0 / (1.0 - std::pow(c.beta1, static_cast<double>(c.step)));
  double c2 = 1.0 / (1.0 - std::pow(c.beta2, static_cast<double>(c.step)));
  for (size_t i = 0; i < s.p.size(); ++i) {
    s.m[i] = c.beta1 * s.m[i] + (1 - c.beta1) * g[i];
    s.v[i] = c.beta2 * s.v[i] + (1 - c.beta2) * g[i] * g[i];
    s.p[i] -= c.lr * ((s.m[i] * c1) / (std::sqrt(s.v[i] * c2) + c.eps) + c.weight_decay * s.p[i]);
  }
}

void run_steps(DType dtype, int64_t n, double rtol, double atol) {
  AdamWConfig config;
  config.lr = 1e-2;
  config.weight_decay = 0.1;
  DType state = accumulation_dtype(dtype);
  std::vector<double> p0 = round_to(random_values(n, 11), dtype);
  Array p = make_array(p0, {n}, dtype), m = zeros({n}, state), v = zeros({n}, state);
  RefState ref{p0, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (int step = 1; step <= 3; ++step) {
    config.step = step;
    std::vector<double> g = round_to(random_values(n, 100 + step), dtype);
    auto out = adamw_update(p, make_array(g, {n}, dtype), m, v, config);
    p = out[0];
    m = out[1];
    v = out[2];
    reference_step(ref, g, config);
    if (dtype == DType::BFloat16 || dtype == DType::Float16) ref.p = round_to(ref.p, dtype);
  }
  EXPECT_EQ(p.dtype(), dtype);
  EXPECT_EQ(m.dtype(), state);
  expect_close(m, ref.m, rtol, atol, std::string("m ") + std::string(name(dtype)));
  expect_close(v, ref.v, rtol, atol, std::string("v ") + std::string(name(dtype)));
  expect_close(p, ref.p,
               dtype == DType::BFloat16  ? 1e-2
               : dtype == DType::Float16 ? 2e-3
                                         : rtol,
               atol, std::string("param ") + std::string(name(dtype)));
}

TEST(AdamW, MatchesTheFormulaOverSeveralSteps) {
  run_steps(DType::Float64, 1037, 1e-12, 1e-14);
  run_steps(DType::Float32, 1037, 1e-5, 1e-7);
  run_steps(DType::BFloat16, 333, 1e-5, 1e-7);
  run_steps(DType::Float16, 333, 1e-5, 1e-7);
  run_steps(DType::Float32, 0, 1e-5, 1e-7);  // empty
}

TEST(AdamW, FusedKernelEqualsComposite) {
  AdamWConfig config;
  config.step = 7;
  config.weight_decay = 0.05;
  Array p = random_array({5, 13}, 1, DType::Float32), g = random_array({5, 13}, 2, DType::Float32);
  Array m = random_array({5, 13}, 3, DType::Float32), v = abs(random_array({5, 13}, 4, DType::Float32));
  auto fused = adamw_update(p, g, m, v, config);
  auto composite = AdamW(config).composite({p, g, m, v});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(fused[i], composite[i], 1e-5, 1e-7)) << "output " << i;
}

TEST(AdamW, BatchesLikeALoop) {
  AdamWConfig config;
  Array p = random_array({3, 8}, 5), g = random_array({3, 8}, 6), m = zeros({3, 8}, DType::Float64);
  Array v = zeros({3, 8}, DType::Float64);
  auto batched = vmap([&](const std::vector<Array>& in) { return adamw_update(in[0], in[1], in[2], in[3], config); })(
      {p, g, m, v});
  for (int64_t b = 0; b < 3; ++b) {
    auto row = [&](const Array& a) { return squeeze(slice_axis(a, 0, b, b + 1), {0}); };
    auto one = adamw_update(row(p), row(g), row(m), row(v), config);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(row(batched[i]), one[i], 1e-14, 1e-15)) << b << " " << i;
  }
}

TEST(AdamW, BadInputIsAClearError) {
  AdamWConfig config;
  Array p = zeros({4}), g = zeros({4}), m = zeros({4}), v = zeros({4});
  EXPECT_TRUE(
      throws_with<ShapeError>([&] { adamw_update(p, zeros({5}), m, v, config); }, {"adamw_update", "[4]", "[5]"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { adamw_update(p, g, zeros({4}, DType::BFloat16), v, config); },
                                      {"adamw_update", "bfloat16", "float32"}));
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { adamw_update(zeros({4}, DType::Int32), zeros({4}, DType::Int32), m, v, config); }, {"int32"}));
  AdamWConfig bad = config;
  bad.step = 0;
  EXPECT_TRUE(throws_with<ValueError>([&] { adamw_update(p, g, m, v, bad); }, {"step 0"}));
  bad = config;
  bad.beta2 = 1.0;
  EXPECT_TRUE(throws_with<ValueError>([&] { adamw_update(p, g, m, v, bad); }, {"beta2=1"}));
}

TEST(AdamW, DifferentiatesThroughItsCompositeForm) {
  // Meta-gradients: d(updated params)/d(params, grad, state) through the composite.
  AdamWConfig config;
  config.step = 3;
  config.weight_decay = 0.1;
  std::function<Array(const std::vector<Array>&)> f = [&](const std::vector<Array>& x) {
    auto out = adamw_update(x[0], x[1], x[2], square(x[3]) + 0.1, config);
    return sum(out[0] * out[0]) + sum(out[1]) + sum(out[2]);
  };
  Array p = random_array({6}, 21), g = random_array({6}, 22), m = random_array({6}, 23), v = random_array({6}, 24);
  EXPECT_TRUE(check_vjp_fd(f, {p, g, m, v}));
}

TEST(AdamW, ScaledGradientEqualsTheMultiplyBitwise) {
  // grad_scale (global-norm clipping folded into the update) gives the bits of the
  // update of multiply(grad, grad_scale), for every float dtype, over several chunks
  // of the parallel kernel; the composite agrees to rounding.
  AdamWConfig config;
  config.weight_decay = 0.1;
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64}) {
    const DType state = accumulation_dtype(dtype);
    const int64_t n = 40001;
    Array p = random_array({n}, 41, dtype), g = random_array({n}, 42, dtype);
    Array m = astype(random_array({n}, 43, state) * 0.1, state);
    Array v = astype(square(random_array({n}, 44, state)) * 0.01, state);
    Array lr = Array::scalar(3e-3, DType::Float32), step = Array::scalar(4, DType::Int64);
    Array scale = astype(Array::scalar(0.3712345, DType::Float64), dtype);
    auto fused = adamw_update(p, g, m, v, lr, step, scale, config);
    auto plain = adamw_update(p, multiply(g, scale), m, v, lr, step, config);
    for (int i = 0; i < 3; ++i) {
      std::vector<double> a = fused[i].to_vector<double>(), b = plain[i].to_vector<double>();
      ASSERT_EQ(a, b) << name(dtype) << " output " << i;
    }
    // A scale of 1 is no scaling at all.
    auto one = adamw_update(p, g, m, v, lr, step, astype(Array::scalar(1.0), dtype), config);
    auto unscaled = adamw_update(p, g, m, v, lr, step, config);
    ASSERT_EQ(one[0].to_vector<double>(), unscaled[0].to_vector<double>()) << name(dtype);
    auto c = AdamW(config, true, true).composite({p, g, m, v, lr, step, scale});
    EXPECT_TRUE(all_close(c[1].to_vector<double>(), fused[1].to_vector<double>(), 1e-6, 1e-7)) << name(dtype);
    EXPECT_TRUE(
        all_close(c[0].to_vector<double>(), fused[0].to_vector<double>(), dtype == DType::BFloat16 ? 1e-2 : 1e-3, 1e-6))
        << name(dtype);
  }
  Array p = random_array({5}, 45, DType::Float32), m = zeros({5}), v = zeros({5});
  Array lr = Array::scalar(1e-3), step = Array::scalar(1, DType::Int64);
  EXPECT_TRUE(
      throws_with<ValueError>([&] { adamw_update(p, p, m, v, lr, step, Array::scalar(0.5, DType::Float64), config); },
                              {"grad_scale", "f64", "float32"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { adamw_update(p, p, m, v, lr, step, zeros({2}), config); },
                                      {"grad_scale", "scalar"}));
  // The attribute names the form, so a parsed program rebuilds it.
  EXPECT_NE(AdamW(config, true, true).attributes().find("scaled_grad=true"), std::string::npos);
  EXPECT_EQ(AdamW(config, true).attributes().find("scaled_grad"), std::string::npos);
}

TEST(AdamW, LowPrecisionGradientsOfFloat32ParamsAreWidenedExactly) {
  // A bfloat16/float16 gradient of a float32 parameter (what the simplify pass hands the
  // update instead of a widening convert) gives the bits of the float32 gradient's
  // update, with and without a grad_scale; other mixes are refused.
  AdamWConfig config;
  config.weight_decay = 0.1;
  const int64_t n = 40001;
  Array p = random_array({n}, 51, DType::Float32);
  Array m = astype(random_array({n}, 52) * 0.1, DType::Float32);
  Array v = astype(square(random_array({n}, 53)) * 0.01, DType::Float32);
  Array lr = Array::scalar(3e-3, DType::Float32), step = Array::scalar(2, DType::Int64);
  Array scale = Array::scalar(0.3712345, DType::Float32);
  for (DType low : {DType::BFloat16, DType::Float16}) {
    Array g = random_array({n}, 54, low);
    Array wide = astype(g, DType::Float32);
    std::vector<std::pair<std::vector<Array>, std::vector<Array>>> cases = {
        {adamw_update(p, g, m, v, lr, step, config), adamw_update(p, wide, m, v, lr, step, config)},
        {adamw_update(p, g, m, v, lr, step, scale, config), adamw_update(p, wide, m, v, lr, step, scale, config)}};
    for (size_t c = 0; c < cases.size(); ++c)
      for (int i = 0; i < 3; ++i)
        ASSERT_EQ(cases[c].first[i].to_vector<double>(), cases[c].second[i].to_vector<double>())
            << name(low) << (c == 1 ? " scaled" : "") << " output " << i;
    auto composite = AdamW(config, true, true).composite({p, g, m, v, lr, step, scale});
    EXPECT_TRUE(all_close(composite[1].to_vector<double>(), cases[1].first[1].to_vector<double>(), 1e-6, 1e-7));
  }
  Array pb = random_array({5}, 55, DType::BFloat16), gf = random_array({5}, 56, DType::Float32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { adamw_update(pb, gf, zeros({5}), zeros({5}), lr, step, config); },
                                      {"grad float32", "bfloat16/float16 for float32"}));
}

TEST(AdamW, ArrayStepAndRateEqualTheStaticForm) {
  // lr and step as arrays (what a jitted training loop passes) give bitwise the same
  // update as the same numbers baked into the primitive.
  AdamWConfig config;
  config.weight_decay = 0.05;
  Array p = random_array({37}, 31, DType::Float32), g = random_array({37}, 32, DType::Float32);
  Array m = zeros({37}), v = zeros({37});
  Array pd = p, md = m, vd = v;
  for (int64_t step = 1; step <= 3; ++step) {
    config.step = step;
    config.lr = 1e-2 / static_cast<double>(step);  // a schedule
    auto s = adamw_update(p, g, m, v, config);
    auto d = adamw_update(pd, g, md, vd, Array::scalar(config.lr, DType::Float64), Array::scalar(step, DType::Int64),
                          config);
    for (int i = 0; i < 3; ++i) {
      std::vector<float> a = s[i].to_vector<float>(), b = d[i].to_vector<float>();
      ASSERT_EQ(a, b) << "step " << step << " output " << i;
    }
    p = s[0], m = s[1], v = s[2], pd = d[0], md = d[1], vd = d[2];
  }
  // The composite (used for meta-gradients) agrees to rounding.
  auto d = adamw_update(p, g, m, v, Array::scalar(0.01, DType::Float32), Array::scalar(4, DType::Int32), config);
  auto c =
      AdamW(config, true).composite({p, g, m, v, Array::scalar(0.01, DType::Float32), Array::scalar(4, DType::Int32)});
  EXPECT_TRUE(all_close(c[0].to_vector<double>(), d[0].to_vector<double>(), 1e-6, 1e-6));

  EXPECT_TRUE(throws_with<ValueError>(
      [&] { adamw_update(p, g, m, v, Array::scalar(0.1, DType::Int32), Array::scalar(1, DType::Int64), config); },
      {"lr", "floating scalar"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] { adamw_update(p, g, m, v, Array::scalar(0.1), zeros({2}, DType::Int64), config); }, {"step", "integer"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] { adamw_update(p, g, m, v, Array::scalar(0.1), Array::scalar(0, DType::Int64), config)[0].eval(); },
      {"adamw_update", "step 0"}));
}

}  // namespace
}  // namespace tessera::test
