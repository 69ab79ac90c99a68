// lion_update: the fused kernel against a float64 loop of the formula and against the
// primitive's composite form, for float64/float32 and low-precision params with float32
// state, sizes with vector tails; sign(0) = 0 and NaN as the sign op; the array-lr
// form; errors; batching; meta-gradients through the composite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"

namespace tessera::test {
namespace {

// The formula of the header, in float64, one step from the given state.
void reference_step(std::vector<double>& p, std::vector<double>& m, const std::vector<double>& g, const LionConfig& c) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double interpolated = c.beta1 * m[i] + (1 - c.beta1) * g[i];
    const double sign = interpolated > 0 ? 1.0 : interpolated < 0 ? -1.0 : interpolated;
    p[i] -= c.lr * (sign + c.weight_decay * p[i]);
    m[i] = c.beta2 * m[i] + (1 - c.beta2) * g[i];
  }
}

// Three steps; each one is judged from the kernel's own state before it (so rounding
// does not accumulate in the comparison). The update lr (1 + wd |p|) is 5% or more of
// the parameters: far above one bfloat16 ulp (0.4%), so the tolerances cannot hide it.
void run_steps(DType dtype, int64_t n) {
  SCOPED_TRACE(std::string(name(dtype)) + " n=" + std::to_string(n));
  LionConfig config;
  config.lr = 5e-2;
  config.beta1 = 0.9;
  config.beta2 = 0.99;
  config.weight_decay = 0.1;
  const DType state = accumulation_dtype(dtype);
  Array p = random_array({n}, 11, dtype), m = zeros({n}, state);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<double> g = round_to(random_values(n, 100 + step), dtype);
    std::vector<double> p_ref = values(p), m_ref = values(m);
    auto out = lion_update(p, make_array(g, {n}, dtype), m, config);
    ASSERT_EQ(out.size(), 2u);
    p = out[0];
    m = out[1];
    reference_step(p_ref, m_ref, g, config);
    EXPECT_EQ(p.dtype(), dtype);
    EXPECT_EQ(m.dtype(), state);
    // m is ~0.1 (g) at most: float32 rounding of its two products is ~1e-9 absolute.
    const bool f64 = state == DType::Float64;
    expect_close(m, m_ref, f64 ? 1e-14 : 1e-6, f64 ? 1e-17 : 1e-8, "m step " + std::to_string(step));
    // One rounding of the result to the parameter's dtype (plus float32 arithmetic),
    // relative to |p| <= 1 where p - lr sign(c) cancels.
    const double p_tol = dtype == DType::Float64    ? 1e-15
                         : dtype == DType::Float32  ? 1e-7
                         : dtype == DType::BFloat16 ? 1.0 / 256
                                                    : 1.0 / 2048;
    expect_close(p, p_ref, p_tol, p_tol, "param step " + std::to_string(step));
  }
}

TEST(Lion, MatchesTheFormulaOverSeveralSteps) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{13}, int64_t{1037}, int64_t{40001}}) {
    run_steps(DType::Float64, n);
    run_steps(DType::Float32, n);
  }
  run_steps(DType::BFloat16, 333);
  run_steps(DType::Float16, 333);
  run_steps(DType::Float32, 0);  // empty
}

TEST(Lion, FusedKernelEqualsComposite) {
  // The composite rounds each op separately where the kernel fuses multiply-adds: equal
  // to float rounding (the sign of the interpolation agrees: no random value cancels).
  LionConfig config;
  config.lr = 3e-2;
  config.weight_decay = 0.05;
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float64}) {
    SCOPED_TRACE(name(dtype));
    const DType state = accumulation_dtype(dtype);
    const Shape shape{5, 13};  // 65 elements: eight vectors and a tail
    Array p = random_array(shape, 1, dtype), g = random_array(shape, 2, dtype), m = random_array(shape, 3, state);
    const double rtol = dtype == DType::Float64 ? 1e-15 : dtype == DType::Float32 ? 1e-6 : 1.0 / 256;
    for (bool dynamic : {false, true}) {
      const Array lr = Array::scalar(config.lr, DType::Float64);
      auto fused = dynamic ? lion_update(p, g, m, lr, config) : lion_update(p, g, m, config);
      auto composite = dynamic ? Lion(config, true).composite({p, g, m, lr}) : Lion(config).composite({p, g, m});
      ASSERT_EQ(composite.size(), 2u);
      EXPECT_EQ(composite[0].dtype(), dtype);
      EXPECT_EQ(composite[1].dtype(), state);
      EXPECT_TRUE(all_close(fused[0], composite[0], rtol, 1e-15)) << "param, dynamic=" << dynamic;
      EXPECT_TRUE(all_close(fused[1], composite[1], state == DType::Float64 ? 1e-15 : 1e-6, 1e-15))
          << "m, dynamic=" << dynamic;
    }
  }
}

TEST(Lion, SignOfZeroIsZeroAndNaNPropagates) {
  // c = 0 (m = g = 0): no step but the decay; c = NaN: a NaN parameter, as sign(NaN).
  LionConfig config;
  config.lr = 0.5;
  config.weight_decay = 0.25;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16}) {
    SCOPED_TRACE(name(dtype));
    const DType state = accumulation_dtype(dtype);
    // 11 elements: the two special ones in the vector part and in the tail.
    std::vector<double> p(11, 0.5), g(11, 0.25), m(11, 0.0);
    g[2] = g[9] = 0;
    g[4] = g[10] = nan;
    const Array pa = make_array(p, {11}, dtype), ga = make_array(g, {11}, dtype), ma = make_array(m, {11}, state);
    auto fused = lion_update(pa, ga, ma, config);
    auto composite = Lion(config).composite({pa, ga, ma});
    for (const auto& out : {fused, composite}) {
      const std::vector<double> pv = values(out[0]), mv = values(out[1]);
      for (int i : {2, 9}) {
        EXPECT_EQ(pv[i], 0.5 - 0.5 * 0.25 * 0.5) << i;  // exact in every dtype
        EXPECT_EQ(mv[i], 0.0) << i;
      }
      for (int i : {4, 10}) {
        EXPECT_TRUE(std::isnan(pv[i])) << i;
        EXPECT_TRUE(std::isnan(mv[i])) << i;
      }
      EXPECT_LT(pv[0], 0.5 - 0.5 * 0.25 * 0.5) << "a positive interpolation steps down";
    }
  }
}

TEST(Lion, ArrayRateEqualsTheStaticForm) {
  // lr as an array (a schedule in a jitted loop) gives bitwise the update with the same
  // number baked into the primitive.
  LionConfig config;
  config.weight_decay = 0.05;
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float64}) {
    SCOPED_TRACE(name(dtype));
    Array p = random_array({37}, 31, dtype), g = random_array({37}, 32, dtype);
    Array m = zeros({37}, accumulation_dtype(dtype));
    Array pd = p, md = m;
    for (int step = 1; step <= 3; ++step) {
      config.lr = 1e-2 / step;
      auto s = lion_update(p, g, m, config);
      auto d = lion_update(pd, g, md, Array::scalar(config.lr, DType::Float64), config);
      for (int i = 0; i < 2; ++i) {
        const Array a = s[i].eval(), b = d[i].eval();
        ASSERT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "step " << step << " output " << i;
      }
      p = s[0], m = s[1], pd = d[0], md = d[1];
    }
  }
}

TEST(Lion, BatchesLikeALoop) {
  LionConfig config;
  config.lr = 1e-2;
  config.weight_decay = 0.1;
  Array p = random_array({3, 8}, 5), g = random_array({3, 8}, 6), m = random_array({3, 8}, 7);
  auto batched =
      vmap([&](const std::vector<Array>& in) { return lion_update(in[0], in[1], in[2], config); })({p, g, m});
  for (int64_t b = 0; b < 3; ++b) {
    auto row = [&](const Array& a) { return squeeze(slice_axis(a, 0, b, b + 1), {0}); };
    auto one = lion_update(row(p), row(g), row(m), config);
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(all_close(row(batched[i]), one[i], 1e-15, 1e-15)) << b << " " << i;
  }
}

TEST(Lion, BadInputIsAClearError) {
  LionConfig config;
  Array p = zeros({4}), g = zeros({4}), m = zeros({4});
  EXPECT_TRUE(throws_with<ShapeError>([&] { lion_update(p, zeros({5}), m, config); }, {"lion_update", "[4]", "[5]"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { lion_update(p, g, zeros({2, 2}), config); }, {"lion_update", "[2, 2]"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { lion_update(p, g, zeros({4}, DType::BFloat16), config); },
                                      {"lion_update", "bfloat16", "float32"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { lion_update(zeros({4}, DType::BFloat16), g, zeros({4}), config); },
                                      {"lion_update", "grad float32"}));
  EXPECT_TRUE(throws_with<DTypeError>(
      [&] { lion_update(zeros({4}, DType::Int32), zeros({4}, DType::Int32), m, config); }, {"int32"}));
  LionConfig bad = config;
  bad.beta1 = 1.0;
  EXPECT_TRUE(throws_with<ValueError>([&] { lion_update(p, g, m, bad); }, {"lion_update", "beta1=1"}));
  bad = config;
  bad.lr = -1;
  EXPECT_TRUE(throws_with<ValueError>([&] { lion_update(p, g, m, bad); }, {"lion_update", "lr=-1"}));
  bad = config;
  bad.weight_decay = -0.5;
  EXPECT_TRUE(throws_with<ValueError>([&] { lion_update(p, g, m, bad); }, {"weight_decay=-0.5"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { lion_update(p, g, m, Array::scalar(1, DType::Int32), config); },
                                      {"lion_update", "lr", "floating scalar"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { lion_update(p, g, m, zeros({2}), config); }, {"lr", "floating scalar"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { lion_update(p, g, m, Array::scalar(-0.1), config)[0].eval(); },
                                      {"lion_update", "lr -0.1"}));
}

TEST(Lion, DifferentiatesThroughItsCompositeForm) {
  // Meta-gradients: sign is flat, so d p' / d p = 1 - lr wd and d m' / d (m, g) = b2, 1 - b2.
  LionConfig config;
  config.lr = 0.1;
  config.weight_decay = 0.1;
  std::function<Array(const std::vector<Array>&)> f = [&](const std::vector<Array>& x) {
    auto out = lion_update(x[0], x[1], x[2], config);
    return sum(out[0] * out[0]) + sum(out[1] * out[1]);
  };
  Array p = random_array({6}, 21), g = random_array({6}, 22), m = random_array({6}, 23);
  EXPECT_TRUE(check_vjp_fd(f, {p, g, m}));
}

}  // namespace
}  // namespace tessera::test
