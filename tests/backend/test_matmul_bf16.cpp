// bfloat16 GEMMs on the CPU's AMX tiles (backend/cpu/kernels/matmul_amx.h): the path
// follows the CPU's features, and its products stay within the format's precision of a
// float64 reference on the transformer's shapes (long K, every transpose, tiles split
// across rows and columns), bitwise equal for 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_amx.h"
#include "nn_test_util.h"

namespace tessera::cpu {
namespace {

using namespace testing;

TEST(Bf16Gemm, UsesTheMatrixUnitsWhereTheCpuHasThem) {
  const std::string flags = cpu_flags();
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  // Only AMX has a kernel: an AVX512-BF16-only CPU (Zen 4) takes the float32 path.
  const bool has_units = flags.find(" amx_bf16 ") != std::string::npos;
  const char* setting = std::getenv("TESSERA_CPU_BF16_GEMM");
  const bool forced_off = setting != nullptr && std::string(setting) == "float32";
  const Bf16GemmPath& path = bf16_gemm_path();
  if (has_units && !forced_off) {
    EXPECT_TRUE(path.native) << "this CPU has bf16 matrix units but the GEMM path is: " << path.description;
    EXPECT_NE(path.description.find("AMX"), std::string::npos) << path.description;
  } else {
    EXPECT_FALSE(path.native) << path.description;
    EXPECT_NE(path.description.find("float32 sgemm"), std::string::npos) << path.description;
  }
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

MatmulShape shape_of(const Case& c) {
  MatmulShape s;
  s.m = c.m, s.n = c.n, s.k = c.k, s.trans_a = c.ta, s.trans_b = c.tb;
  return s;
}

// The transformer's GEMMs at batch x seq = 1024 (forward, dX and dW layouts), a long K,
// and odd sizes that leave partial AMX tiles (16 rows x 32 pairs).
const Case kCases[] = {{1024, 768, 256, false, false}, {1024, 256, 768, false, true}, {256, 768, 1024, true, false},
                       {1100, 300, 2048, false, true}, {37, 1300, 61, true, true},    {1, 5, 3, false, false}};

TEST(Bf16Gemm, ProductsStayWithinBf16PrecisionOfFloat64) {
  for (const Case& c : kCases) {
    const auto a = rounded(DType::BFloat16, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 801));
    const auto b = rounded(DType::BFloat16, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 802));
    Buf ab(DType::BFloat16, a), bb(DType::BFloat16, b), cb(DType::BFloat16, c.m * c.n);
    matmul(DType::BFloat16, shape_of(c), ab.data(), bb.data(), cb.data());
    double worst = 0;
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double exact = 0, magnitude = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double av = a[static_cast<size_t>(c.ta ? p * c.m + i : i * c.k + p)];
          const double bv = b[static_cast<size_t>(c.tb ? j * c.k + p : p * c.n + j)];
          exact += av * bv;
          magnitude += std::abs(av * bv);
        }
        // One bf16 rounding of the result (half an ulp: 2^-9 relative) plus float32
        // accumulation (products of bf16 values are exact in float32; k sums of rounding
        // 2^-24 each, bounded by the magnitude).
        const double tol = std::ldexp(std::abs(exact), -8) + static_cast<double>(c.k) * std::ldexp(magnitude, -24);
        const double err = std::abs(cb.get(i * c.n + j) - exact);
        ASSERT_LE(err, tol) << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.ta << " tb=" << c.tb
                            << " at (" << i << ", " << j << ") exact " << exact;
        if (std::abs(exact) > 1e-3) worst = std::max(worst, err / std::abs(exact));
      }
    }
    // A bf16 result is off by at most half an ulp of its own rounding when the float32
    // sum is close: typical worst relative errors are ~2^-9.
    EXPECT_LT(worst, 0.02) << "m=" << c.m << " n=" << c.n << " k=" << c.k;
  }
}

TEST(Bf16Gemm, BitwiseIdenticalForOneAndTwoThreads) {
  for (const Case& c : kCases) {
    Buf a(DType::BFloat16, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 811));
    Buf b(DType::BFloat16, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 812));
    Buf one(DType::BFloat16, c.m * c.n), two(DType::BFloat16, c.m * c.n);
    with_threads(1, [&] { matmul(DType::BFloat16, shape_of(c), a.data(), b.data(), one.data()); });
    with_threads(2, [&] { matmul(DType::BFloat16, shape_of(c), a.data(), b.data(), two.data()); });
    EXPECT_TRUE(one.bitwise_equal(two)) << "m=" << c.m << " n=" << c.n << " k=" << c.k;
  }
}

}  // namespace
}  // namespace tessera::cpu
