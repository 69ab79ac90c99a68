// int8 (AQT) GEMMs (backend/cpu/kernels/matmul_int8.h): within the quantization's bound
// of a float64 product of the unquantized operands; the AMX and AVX512-VNNI kernels
// bitwise equal to the float64 reference path (same quantized values, exact products),
// epilogue included; bitwise equal for 1 and 2 threads; stochastic rounding unbiased where nearest rounding is not; a
// non-finite input poisons only its own row; lines of tiny, infinite, NaN or zero values
// quantize as the reference does.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

bool has_flag(const std::string& flags, const char* flag) {
  return flags.find(std::string(" ") + flag + " ") != std::string::npos;
}

TEST(Int8Gemm, PathFollowsTheCpusInt8Units) {
  const std::string flags = cpu_flags();
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const bool avx512 = has_flag(flags, "avx512f") && has_flag(flags, "avx512bw") && has_flag(flags, "avx512vl") &&
                      has_flag(flags, "avx512dq");
  const bool amx = has_flag(flags, "amx_int8") && avx512;
  const bool vnni = has_flag(flags, "avx512_vnni") && avx512;
  EXPECT_EQ(int8_kernel_usable(Int8Kernel::Amx), amx);
  EXPECT_EQ(int8_kernel_usable(Int8Kernel::Avx512Vnni), vnni);
  const char* setting = std::getenv("TESSERA_CPU_INT8_GEMM");
  const std::string mode = setting && *setting ? setting : "auto";
  Int8Kernel want = amx ? Int8Kernel::Amx : vnni ? Int8Kernel::Avx512Vnni : Int8Kernel::Reference;
  if (mode == "reference") want = Int8Kernel::Reference;
  if (mode == "amx") want = amx ? Int8Kernel::Amx : Int8Kernel::Reference;
  if (mode == "avx512vnni") want = vnni ? Int8Kernel::Avx512Vnni : Int8Kernel::Reference;
  const Int8GemmPath& path = int8_gemm_path();
  EXPECT_EQ(int8_kernel_name(path.kernel), std::string(int8_kernel_name(want))) << path.description;
  EXPECT_EQ(path.native, want != Int8Kernel::Reference) << path.description;
  const char* says = want == Int8Kernel::Amx ? "AMX" : want == Int8Kernel::Avx512Vnni ? "AVX512-VNNI" : "float64";
  EXPECT_NE(path.description.find(says), std::string::npos) << path.description;
}

// The int8 units this machine has (AMX, AVX512-VNNI).
std::vector<Int8Kernel> units_here() {
  std::vector<Int8Kernel> out;
  for (Int8Kernel k : {Int8Kernel::Amx, Int8Kernel::Avx512Vnni})
    if (int8_kernel_usable(k)) out.push_back(k);
  return out;
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

// A Linear's three GEMMs at 512 tokens (forward; dX with the weight transposed; dW with
// the activations transposed), both transposed, and sizes leaving partial tiles and
// blocks (32 rows, 16 columns, 64 K).
const Case kCases[] = {{512, 384, 256, false, false}, {512, 256, 384, false, true}, {256, 384, 512, true, false},
                       {37, 70, 131, true, true},     {1, 5, 3, false, false},      {100, 33, 1000, false, true},
                       {45, 200, 70, false, false},   {9, 130, 64, true, true}};

double a_at(const std::vector<double>& a, const Case& c, int64_t i, int64_t p) {
  return a[static_cast<size_t>(c.ta ? p * c.m + i : i * c.k + p)];
}
double b_at(const std::vector<double>& b, const Case& c, int64_t p, int64_t j) {
  return b[static_cast<size_t>(c.tb ? j * c.k + p : p * c.n + j)];
}

TEST(Int8Gemm, ProductsStayWithinTheQuantizationBoundOfFloat64) {
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    for (const Case& c : kCases) {
      const auto a = rounded(dtype, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 901));
      const auto b = rounded(dtype, uniform(static_cast<size_t>(c.k * c.n), -2, 2, 902));
      Buf ab(dtype, a), bb(dtype, b), cb(dtype, c.m * c.n);
      quantized_matmul(dtype, shape_of(c), ab.data(), bb.data(), cb.data(), {}, {});
      std::vector<double> amax(static_cast<size_t>(c.m), 0), bmax(static_cast<size_t>(c.n), 0);
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t p = 0; p < c.k; ++p) amax[i] = std::max(amax[i], std::abs(a_at(a, c, i, p)));
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t p = 0; p < c.k; ++p) bmax[j] = std::max(bmax[j], std::abs(b_at(b, c, p, j)));
      double worst = 0;
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) {
          // Nearest rounding moves each value by at most half a step (amax / 254).
          const double da = amax[i] / 254, db = bmax[j] / 254;
          double exact = 0, bound = 0;
          for (int64_t p = 0; p < c.k; ++p) {
            const double av = a_at(a, c, i, p), bv = b_at(b, c, p, j);
            exact += av * bv;
            bound += std::abs(av) * db + std::abs(bv) * da + da * db;
          }
          // Plus the output's rounding (bf16: 2^-9 relative) and float32 dequantization.
          const double tol = bound * 1.001 + std::ldexp(std::abs(exact), dtype == DType::BFloat16 ? -8 : -20) + 1e-12;
          const double err = std::abs(cb.get(i * c.n + j) - exact);
          ASSERT_LE(err, tol) << name(dtype) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.ta
                              << " tb=" << c.tb << " at (" << i << ", " << j << ") exact " << exact;
          worst = std::max(worst, err / (bound + 1e-30));
        }
      }
      // Errors of independent roundings partly cancel: far below the worst case.
      if (c.k >= 100) {
        EXPECT_LT(worst, 0.5) << name(dtype) << " k=" << c.k;
      }
    }
  }
}

// int32 sums are exact: each kernel gives bitwise the float64 path's C, with and without
// stochastic rounding and the fused epilogue (bias, GELU, the pre-activation kept).
TEST(Int8Gemm, EveryKernelGivesBitwiseTheFloat64ReferencePath) {
  if (units_here().empty()) GTEST_SKIP() << "no int8 units here: " << int8_gemm_path().description;
  for (Int8Kernel kernel : units_here()) {
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      for (const Case& c : kCases) {
        for (int variant = 0; variant < 3; ++variant) {
          const bool stochastic = variant >= 1, fused = variant == 2;
          Buf a(dtype, uniform(static_cast<size_t>(c.m * c.k), -3, 3, 911));
          Buf b(dtype, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 912));
          Buf bias(dtype, uniform(static_cast<size_t>(c.n), -1, 1, 913));
          Buf fast(dtype, c.m * c.n), reference(dtype, c.m * c.n);
          Buf fast_pre(dtype, c.m * c.n), reference_pre(dtype, c.m * c.n);
          const Int8Rounding ra{stochastic, 0x1234'5678'9abc'def0ull}, rb{stochastic, 77};
          GemmEpilogue e;
          e.bias = bias.data();
          e.has_activation = true;
          e.activation = UnaryOp::GeluTanh;
          e.pre_activation = fast_pre.data();
          quantized_matmul(kernel, dtype, shape_of(c), a.data(), b.data(), fast.data(), ra, rb, fused ? &e : nullptr);
          e.pre_activation = reference_pre.data();
          quantized_matmul_reference(dtype, shape_of(c), a.data(), b.data(), reference.data(), ra, rb,
                                     fused ? &e : nullptr);
          const std::string what = fmt::format("{} {} m={} n={} k={} ta={} tb={} variant={}", int8_kernel_name(kernel),
                                               name(dtype), c.m, c.n, c.k, c.ta, c.tb, variant);
          EXPECT_TRUE(fast.bitwise_equal(reference)) << what;
          if (fused) {
            EXPECT_TRUE(fast_pre.bitwise_equal(reference_pre)) << what;
          }
        }
      }
    }
  }
}

// Lines the quantizer's clamps exist for, every kernel against the reference bitwise:
// values so small that the inverse scale overflows to inf (a zero among them becomes
// 0 * inf = NaN), a +inf, a -inf, a NaN, all zeros; in A's rows and B's columns, for
// every layout, both dtypes and both roundings.
TEST(Int8Gemm, EdgeLinesGiveBitwiseTheReference) {
  if (units_here().empty()) GTEST_SKIP() << "no int8 units here: " << int8_gemm_path().description;
  // Line l of op(A) (a row) or op(B) (a column), contraction index p: its value.
  auto edge = [](int line, int64_t p, double plain) {
    switch (line) {
      case 0:
        return p % 7 == 3 ? 0.0 : (p % 2 ? -1.0 : 1.0) * 1e-39 * static_cast<double>(1 + p % 5);
      case 1:
        return p == 5 ? INFINITY : plain;
      case 2:
        return p == 2 ? -INFINITY : plain;
      case 3:
        return p == 9 ? NAN : plain;
      case 4:
        return 0.0;
      default:
        return plain;
    }
  };
  for (Int8Kernel kernel : units_here()) {
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      for (const Case& c : {Case{40, 35, 70, false, false}, Case{40, 35, 70, true, true}, Case{33, 48, 64, true, false},
                            Case{33, 48, 64, false, true}}) {
        std::vector<double> a = uniform(static_cast<size_t>(c.m * c.k), -2, 2, 941);
        std::vector<double> b = uniform(static_cast<size_t>(c.k * c.n), -1, 1, 942);
        for (int line = 0; line < 5; ++line)
          for (int64_t p = 0; p < c.k; ++p) {
            double& av = a[static_cast<size_t>(c.ta ? p * c.m + 2 * line : 2 * line * c.k + p)];
            av = edge(line, p, av);
            double& bv = b[static_cast<size_t>(c.tb ? (3 * line + 1) * c.k + p : p * c.n + 3 * line + 1)];
            bv = edge(line, p, bv);
          }
        for (bool stochastic : {false, true}) {
          const Int8Rounding ra{stochastic, 5}, rb{stochastic, 6};
          Buf ab(dtype, a), bb(dtype, b), fast(dtype, c.m * c.n), reference(dtype, c.m * c.n);
          quantized_matmul(kernel, dtype, shape_of(c), ab.data(), bb.data(), fast.data(), ra, rb);
          quantized_matmul_reference(dtype, shape_of(c), ab.data(), bb.data(), reference.data(), ra, rb);
          EXPECT_TRUE(fast.bitwise_equal(reference))
              << fmt::format("{} {} m={} n={} k={} ta={} tb={} stochastic={}", int8_kernel_name(kernel), name(dtype),
                             c.m, c.n, c.k, c.ta, c.tb, stochastic);
        }
      }
    }
  }
}

TEST(Int8Gemm, AKernelThisMachineCannotRunIsRefused) {
  for (Int8Kernel kernel : {Int8Kernel::Amx, Int8Kernel::Avx512Vnni}) {
    const char* why = "";
    if (int8_kernel_usable(kernel, &why)) continue;
    EXPECT_NE(std::string(why), "") << int8_kernel_name(kernel);
    MatmulShape s;
    s.m = s.n = s.k = 2;
    Buf a(DType::Float32, 4), b(DType::Float32, 4), c(DType::Float32, 4);
    EXPECT_THROW(quantized_matmul(kernel, DType::Float32, s, a.data(), b.data(), c.data(), {}, {}), ValueError);
  }
}

TEST(Int8Gemm, BitwiseIdenticalForOneAndTwoThreads) {
  std::vector<Int8Kernel> kernels = units_here();
  kernels.push_back(Int8Kernel::Reference);
  for (Int8Kernel kernel : kernels) {
    for (const Case& c : kCases) {
      Buf a(DType::BFloat16, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 921));
      Buf b(DType::BFloat16, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 922));
      Buf bias(DType::BFloat16, uniform(static_cast<size_t>(c.n), -1, 1, 923));
      for (bool fused : {false, true}) {
        Buf one(DType::BFloat16, c.m * c.n), two(DType::BFloat16, c.m * c.n);
        const Int8Rounding r{true, 5};
        GemmEpilogue e;
        e.bias = bias.data();
        e.has_activation = true;
        e.activation = UnaryOp::GeluTanh;
        auto run = [&](Buf& out) {
          quantized_matmul(kernel, DType::BFloat16, shape_of(c), a.data(), b.data(), out.data(), r, {},
                           fused ? &e : nullptr);
        };
        with_threads(1, [&] { run(one); });
        with_threads(2, [&] { run(two); });
        EXPECT_TRUE(one.bitwise_equal(two))
            << int8_kernel_name(kernel) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " fused=" << fused;
      }
    }
  }
}

// A row whose values sit 0.3 of a step above a grid point: nearest rounding loses 0.3
// steps on every element; stochastic rounding is right on average over seeds.
TEST(Int8Gemm, StochasticRoundingIsUnbiased) {
  const int64_t k = 256;
  std::vector<double> a(static_cast<size_t>(k));
  const double step = 1.0 / 127;  // amax = 1
  a[0] = 1.0;
  for (int64_t p = 1; p < k; ++p) a[static_cast<size_t>(p)] = (static_cast<double>(p % 50) + 0.3) * step;
  double exact = 0;
  for (double v : a) exact += v;
  Buf ab(DType::Float32, a), ones(DType::Float32, std::vector<double>(static_cast<size_t>(k), 1.0));
  MatmulShape s;
  s.m = 1, s.n = 1, s.k = k;
  Buf c(DType::Float32, 1);
  quantized_matmul(DType::Float32, s, ab.data(), ones.data(), c.data(), {}, {});
  const double nearest_bias = c.get(0) - exact;
  EXPECT_NEAR(nearest_bias, -0.3 * step * (k - 1), 1e-3) << "nearest rounding drops the 0.3-step tails";
  double mean = 0;
  const int draws = 400;
  for (int d = 0; d < draws; ++d) {
    quantized_matmul(DType::Float32, s, ab.data(), ones.data(), c.data(), {true, static_cast<uint64_t>(d) * 7919}, {});
    mean += c.get(0) / draws;
  }
  // Each element's rounding has variance 0.21 steps^2: the mean over 400 draws of 255
  // elements has a standard deviation of about 0.04 steps; the nearest bias is 76 steps.
  EXPECT_NEAR(mean, exact, 0.3 * step) << "stochastic rounding mean " << mean << " vs " << exact;
}

TEST(Int8Gemm, ANonFiniteValuePoisonsOnlyItsRowAndColumn) {
  const Case c{4, 3, 70, false, false};
  std::vector<double> a = uniform(static_cast<size_t>(c.m * c.k), -1, 1, 931);
  std::vector<double> b = uniform(static_cast<size_t>(c.k * c.n), -1, 1, 932);
  a[static_cast<size_t>(1 * c.k + 5)] = INFINITY;  // row 1 of A
  b[static_cast<size_t>(9 * c.n + 2)] = NAN;       // column 2 of B
  Buf ab(DType::Float32, a), bb(DType::Float32, b), cb(DType::Float32, c.m * c.n);
  quantized_matmul(DType::Float32, shape_of(c), ab.data(), bb.data(), cb.data(), {}, {});
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j)
      EXPECT_EQ(std::isnan(cb.get(i * c.n + j)), i == 1 || j == 2) << "(" << i << ", " << j << ")";
}

TEST(Int8Gemm, RejectsOtherDtypesAndBatches) {
  MatmulShape s;
  s.m = s.n = s.k = 2;
  Buf a(DType::Float64, 4), b(DType::Float64, 4), c(DType::Float64, 4);
  EXPECT_THROW(quantized_matmul(DType::Float64, s, a.data(), b.data(), c.data(), {}, {}), DTypeError);
  s.batch = 2;
  EXPECT_THROW(quantized_matmul(DType::Float32, s, a.data(), b.data(), c.data(), {}, {}), ShapeError);
}

}  // namespace
}  // namespace tessera::cpu
