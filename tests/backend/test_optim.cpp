// adamw_update vs a float64 reference of the AdamW formula over several steps, for
// every float dtype (fp32 state for low-precision parameters), odd sizes that exercise
// the vector tail, and thread-count independence.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/kernels/optim.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

void ref_adamw(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m, std::vector<double>& v,
               const AdamWConfig& c) {
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(c.step));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(c.step));
  for (size_t i = 0; i < p.size(); ++i) {
    m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
    v[i] = c.beta2 * v[i] + (1 - c.beta2) * g[i] * g[i];
    p[i] -= c.lr * ((m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps) + c.weight_decay * p[i]);
  }
}

TEST(AdamW, MatchesReferenceOverSeveralSteps) {
  for (DType dt : kFloatTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{33}, int64_t{1000}, int64_t{20001}}) {
      SCOPED_TRACE(::testing::Message() << name(dt) << " n=" << n);
      const DType st = accumulation_dtype(dt);
      AdamWConfig cfg;
      cfg.lr = 1e-2, cfg.weight_decay = 0.1;
      std::vector<double> m(static_cast<size_t>(n), 0.0), v = m;
      Buf pb(dt, uniform(static_cast<size_t>(n), -1, 1, 701)), mb(st, m), vb(st, v);
      for (int64_t step = 1; step <= 3; ++step) {
        cfg.step = step;
        auto g = rounded(dt, uniform(static_cast<size_t>(n), -1, 1, 702 + static_cast<uint32_t>(step)));
        Buf gb(dt, g);
        // The reference starts each step from the kernel's (rounded) parameters, so each
        // step's error is judged alone; m and v follow the recurrence from exact inputs.
        std::vector<double> p_ref = pb.values();
        adamw_update(dt, pb.data(), gb.data(), mb.data(), vb.data(), n, cfg);
        ref_adamw(p_ref, g, m, v, cfg);
        expect_close(pb.values(), p_ref, tol_for(dt), "param");
        expect_close(mb.values(), m, tol_for(st), "m");
        expect_close(vb.values(), v, tol_for(st), "v");
      }
    }
  }
}

TEST(AdamW, BitwiseIdenticalAcrossThreadCounts) {
  const int64_t n = 100003;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    const DType st = accumulation_dtype(dt);
    Buf p0(dt, uniform(n, -1, 1, 711)), g(dt, uniform(n, -1, 1, 712)), m0(st, uniform(n, -0.1, 0.1, 713));
    Buf v0(st, uniform(n, 0, 0.01, 714));
    Buf p1 = p0, p2 = p0, m1 = m0, m2 = m0, v1 = v0, v2 = v0;
    AdamWConfig cfg;
    cfg.step = 7, cfg.weight_decay = 0.01;
    with_threads(1, [&] { adamw_update(dt, p1.data(), g.data(), m1.data(), v1.data(), n, cfg); });
    with_threads(2, [&] { adamw_update(dt, p2.data(), g.data(), m2.data(), v2.data(), n, cfg); });
    EXPECT_TRUE(p1.bitwise_equal(p2));
    EXPECT_TRUE(m1.bitwise_equal(m2));
    EXPECT_TRUE(v1.bitwise_equal(v2));
  }
}

TEST(AdamW, RejectsBadConfig) {
  Buf p(DType::Float32, 4), g(DType::Float32, 4), m(DType::Float32, 4), v(DType::Float32, 4);
  AdamWConfig cfg;
  cfg.step = 0;
  EXPECT_THROW(adamw_update(DType::Float32, p.data(), g.data(), m.data(), v.data(), 4, cfg), ValueError);
  cfg.step = 1, cfg.beta2 = 1.0;
  EXPECT_THROW(adamw_update(DType::Float32, p.data(), g.data(), m.data(), v.data(), 4, cfg), ValueError);
  cfg.beta2 = 0.999;
  EXPECT_THROW(adamw_update(DType::Int32, p.data(), g.data(), m.data(), v.data(), 4, cfg), DTypeError);
}

}  // namespace
}  // namespace tessera::cpu
