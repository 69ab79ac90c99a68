// lion_update vs a float64 reference of the Lion formula over several steps, for every
// float dtype (fp32 state for low-precision parameters), odd sizes that exercise the
// vector tail and several chunks; bitwise the documented fma sequence (what the CUDA
// kernel runs too); thread-count independence.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cpu/kernels/optim.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

void ref_lion(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m, const LionConfig& c) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double interpolated = c.beta1 * m[i] + (1 - c.beta1) * g[i];
    const double sign = interpolated > 0 ? 1.0 : interpolated < 0 ? -1.0 : interpolated;
    p[i] -= c.lr * (sign + c.weight_decay * p[i]);
    m[i] = c.beta2 * m[i] + (1 - c.beta2) * g[i];
  }
}

TEST(Lion, MatchesReferenceOverSeveralSteps) {
  for (DType dt : kFloatTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{33}, int64_t{1000}, int64_t{40001}}) {
      SCOPED_TRACE(::testing::Message() << name(dt) << " n=" << n);
      const DType st = accumulation_dtype(dt);
      LionConfig cfg;
      cfg.lr = 1e-2, cfg.weight_decay = 0.1;
      Buf pb(dt, uniform(static_cast<size_t>(n), -1, 1, 801)), mb(st, uniform(static_cast<size_t>(n), -0.1, 0.1, 802));
      for (int step = 1; step <= 3; ++step) {
        const std::vector<double> g = rounded(dt, uniform(static_cast<size_t>(n), -1, 1, 803 + step));
        Buf gb(dt, g);
        // Each step from the kernel's own (rounded) state: its error is judged alone.
        std::vector<double> p_ref = pb.values(), m_ref = mb.values();
        lion_update(dt, pb.data(), gb.data(), mb.data(), n, cfg);
        ref_lion(p_ref, g, m_ref, cfg);
        expect_close(pb.values(), p_ref, tol_for(dt), "param");
        expect_close(mb.values(), m_ref, tol_for(st), "m");
      }
    }
  }
}

// The sequence the header promises, in the accumulation type A:
//   c = fma(b1, m, (1-b1) g);  m' = fma(b2, m, (1-b2) g);  p' = fma(-lr, fma(wd, p, sign(c)), p)
template <typename A>
void fma_sequence(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m, const LionConfig& c) {
  const A b1 = static_cast<A>(c.beta1), b2 = static_cast<A>(c.beta2), a1 = static_cast<A>(1.0 - c.beta1);
  const A a2 = static_cast<A>(1.0 - c.beta2), lr = static_cast<A>(c.lr), wd = static_cast<A>(c.weight_decay);
  for (size_t i = 0; i < p.size(); ++i) {
    const A pi = static_cast<A>(p[i]), gi = static_cast<A>(g[i]), mi = static_cast<A>(m[i]);
    const A ci = std::fma(b1, mi, a1 * gi);
    const A s = ci > 0 ? A(1) : ci < 0 ? A(-1) : ci;
    m[i] = std::fma(b2, mi, a2 * gi);
    p[i] = std::fma(-lr, std::fma(wd, pi, s), pi);
  }
}

// Equal values with equal signs of zero, NaN where the other is NaN (payloads aside).
::testing::AssertionResult same_values(const Buf& got, const Buf& want) {
  for (int64_t i = 0; i < want.size(); ++i) {
    const double a = got.get(i), b = want.get(i);
    const bool same = std::isnan(b) ? std::isnan(a) : a == b && std::signbit(a) == std::signbit(b);
    if (!same) return ::testing::AssertionFailure() << "element " << i << ": got " << a << ", want " << b;
  }
  return ::testing::AssertionSuccess();
}

TEST(Lion, IsTheFmaSequenceBitwise) {
  // Vector lanes, the masked tail and the scalar path all give the sequence's bits,
  // zeros and NaNs included (sign keeps them).
  const int64_t n = 20011;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(name(dt));
    const DType st = accumulation_dtype(dt);
    LionConfig cfg;
    cfg.lr = 3e-3, cfg.beta1 = 0.95, cfg.beta2 = 0.98, cfg.weight_decay = 0.1;
    std::vector<double> p = uniform(n, -1, 1, 811), g = uniform(n, -1, 1, 812), m = uniform(n, -0.1, 0.1, 813);
    for (int64_t i : {int64_t{3}, int64_t{100}, n - 2}) g[i] = m[i] = 0;                    // c = 0
    for (int64_t i : {int64_t{5}, n - 1}) g[i] = std::numeric_limits<double>::quiet_NaN();  // c = NaN
    Buf pb(dt, p), gb(dt, g), mb(st, m);
    std::vector<double> p_want = pb.values(), m_want = mb.values();
    if (st == DType::Float64) {
      fma_sequence<double>(p_want, gb.values(), m_want, cfg);
    } else {
      fma_sequence<float>(p_want, gb.values(), m_want, cfg);
    }
    const Buf p_expected(dt, p_want), m_expected(st, m_want);
    lion_update(dt, pb.data(), gb.data(), mb.data(), n, cfg);
    EXPECT_TRUE(same_values(pb, p_expected)) << "param";
    EXPECT_TRUE(same_values(mb, m_expected)) << "m";
    EXPECT_TRUE(std::isnan(pb.get(5)) && std::isnan(pb.get(n - 1)));
  }
}

TEST(Lion, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t n = 100003;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    const DType st = accumulation_dtype(dt);
    Buf p0(dt, uniform(n, -1, 1, 821)), g(dt, uniform(n, -1, 1, 822)), m0(st, uniform(n, -0.1, 0.1, 823));
    Buf p1 = p0, p2 = p0, m1 = m0, m2 = m0;
    LionConfig cfg;
    cfg.weight_decay = 0.01;
    with_threads(1, [&] { lion_update(dt, p1.data(), g.data(), m1.data(), n, cfg); });
    with_threads(2, [&] { lion_update(dt, p2.data(), g.data(), m2.data(), n, cfg); });
    EXPECT_TRUE(p1.bitwise_equal(p2));
    EXPECT_TRUE(m1.bitwise_equal(m2));
  }
}

TEST(Lion, RejectsBadConfig) {
  Buf p(DType::Float32, 4), g(DType::Float32, 4), m(DType::Float32, 4);
  LionConfig cfg;
  cfg.beta1 = 1.0;
  EXPECT_THROW(lion_update(DType::Float32, p.data(), g.data(), m.data(), 4, cfg), ValueError);
  cfg.beta1 = 0.9, cfg.lr = -1;
  EXPECT_THROW(lion_update(DType::Float32, p.data(), g.data(), m.data(), 4, cfg), ValueError);
  cfg.lr = 1e-3;
  EXPECT_THROW(lion_update(DType::Float32, p.data(), g.data(), m.data(), -1, cfg), ValueError);
  EXPECT_THROW(lion_update(DType::Int32, p.data(), g.data(), m.data(), 4, cfg), DTypeError);
}

}  // namespace
}  // namespace tessera::cpu
