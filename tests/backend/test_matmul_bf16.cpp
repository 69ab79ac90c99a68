// bfloat16 GEMMs on the CPU's bf16 units (backend/cpu/kernels/matmul.h's Bf16Kernel:
// AMX tiles, AVX512-BF16, or float32 sgemm on widened operands): the path follows the
// CPU's features; every kernel this machine can run stays within the format's precision
// of a float64 reference on the transformer's shapes (long K, every transpose, tiles split
// across rows and columns, partial micro-tiles), is bitwise equal for 1 and 2 threads, and
// its fused bias/GELU epilogue is bitwise the unfused ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cpu/kernels/elementwise.h"
#include "backend/cpu/kernels/matmul.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

bool has_flag(const std::string& flags, const char* flag) {
  return flags.find(std::string(" ") + flag + " ") != std::string::npos;
}

TEST(Bf16Gemm, PathFollowsTheCpusBf16Units) {
  const std::string flags = cpu_flags();
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const bool amx = has_flag(flags, "amx_bf16");
  const bool avx512bf16 = has_flag(flags, "avx512_bf16") && has_flag(flags, "avx512bw") && has_flag(flags, "avx512vl");
  EXPECT_EQ(bf16_kernel_usable(Bf16Kernel::Amx), amx);
  EXPECT_EQ(bf16_kernel_usable(Bf16Kernel::Avx512Bf16), avx512bf16);
  EXPECT_TRUE(bf16_kernel_usable(Bf16Kernel::Float32));
  const char* setting = std::getenv("TESSERA_CPU_BF16_GEMM");
  const std::string mode = setting && *setting ? setting : "auto";
  Bf16Kernel want = amx ? Bf16Kernel::Amx : avx512bf16 ? Bf16Kernel::Avx512Bf16 : Bf16Kernel::Float32;
  if (mode == "float32") want = Bf16Kernel::Float32;
  if (mode == "amx") want = amx ? Bf16Kernel::Amx : Bf16Kernel::Float32;
  if (mode == "avx512bf16") want = avx512bf16 ? Bf16Kernel::Avx512Bf16 : Bf16Kernel::Float32;
  const Bf16GemmPath& path = bf16_gemm_path();
  EXPECT_EQ(bf16_kernel_name(path.kernel), std::string(bf16_kernel_name(want))) << path.description;
  EXPECT_EQ(path.native, want != Bf16Kernel::Float32) << path.description;
  const char* says = want == Bf16Kernel::Amx ? "AMX" : want == Bf16Kernel::Avx512Bf16 ? "AVX512-BF16" : "float32 sgemm";
  EXPECT_NE(path.description.find(says), std::string::npos) << path.description;
  // compute_dtype "auto" takes bf16 where its GEMMs beat sgemm: AMX, or AVX512-BF16 on AMD
  // (VDPBF16PS at the FMA's issue rate), not on Intel (half of it).
  const bool amd = cpuinfo_field("vendor_id").find("AuthenticAMD") != std::string::npos;
  EXPECT_EQ(path.faster_than_float32, want == Bf16Kernel::Amx || (want == Bf16Kernel::Avx512Bf16 && amd))
      << path.description;
}

TEST(Bf16Gemm, AKernelThisMachineCannotRunIsRefused) {
  for (Bf16Kernel kernel : {Bf16Kernel::Amx, Bf16Kernel::Avx512Bf16}) {
    const char* why = "";
    if (bf16_kernel_usable(kernel, &why)) continue;
    EXPECT_NE(std::string(why), "") << bf16_kernel_name(kernel);
    MatmulShape s;
    s.m = s.n = s.k = 2;
    std::vector<bfloat16> a(4), b(4), c(4);
    EXPECT_THROW(matmul_bf16(kernel, s, a.data(), b.data(), c.data()), ValueError);
  }
}

// The kernels this machine runs (float32 everywhere).
std::vector<Bf16Kernel> kernels_here() {
  std::vector<Bf16Kernel> out;
  for (Bf16Kernel k : {Bf16Kernel::Float32, Bf16Kernel::Amx, Bf16Kernel::Avx512Bf16})
    if (bf16_kernel_usable(k)) out.push_back(k);
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

// The transformer's GEMMs at batch x seq = 1024 (forward, dX and dW layouts), a long K,
// and odd sizes that leave partial AMX tiles (16 rows x 32 pairs) and partial
// AVX512-BF16 micro-tiles (8 rows x 48 columns; K odd).
const Case kCases[] = {{1024, 768, 256, false, false}, {1024, 256, 768, false, true}, {256, 768, 1024, true, false},
                       {1100, 300, 2048, false, true}, {37, 1300, 61, true, true},    {1, 5, 3, false, false},
                       {45, 50, 33, false, true},      {13, 80, 64, true, false}};

TEST(Bf16Gemm, ProductsStayWithinBf16PrecisionOfFloat64) {
  for (Bf16Kernel kernel : kernels_here()) {
    SCOPED_TRACE(bf16_kernel_name(kernel));
    for (const Case& c : kCases) {
      const auto a = rounded(DType::BFloat16, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 801));
      const auto b = rounded(DType::BFloat16, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 802));
      Buf ab(DType::BFloat16, a), bb(DType::BFloat16, b), cb(DType::BFloat16, c.m * c.n);
      matmul_bf16(kernel, shape_of(c), static_cast<const bfloat16*>(ab.data()), static_cast<const bfloat16*>(bb.data()),
                  static_cast<bfloat16*>(cb.data()));
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
}

TEST(Bf16Gemm, BitwiseIdenticalForOneAndTwoThreads) {
  for (Bf16Kernel kernel : kernels_here()) {
    for (const Case& c : kCases) {
      Buf a(DType::BFloat16, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 811));
      Buf b(DType::BFloat16, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 812));
      Buf one(DType::BFloat16, c.m * c.n), two(DType::BFloat16, c.m * c.n);
      auto run = [&](Buf& out) {
        matmul_bf16(kernel, shape_of(c), static_cast<const bfloat16*>(a.data()), static_cast<const bfloat16*>(b.data()),
                    static_cast<bfloat16*>(out.data()));
      };
      with_threads(1, [&] { run(one); });
      with_threads(2, [&] { run(two); });
      EXPECT_TRUE(one.bitwise_equal(two)) << bf16_kernel_name(kernel) << " m=" << c.m << " n=" << c.n << " k=" << c.k;
    }
  }
}

// The epilogue of each kernel against the unfused ops on its own product (each op widens
// bf16 to float32 and rounds the result again): bias + GELU with the pre-activation kept,
// bias alone, bias first (NaN payloads follow the operand order) with GELU and no
// pre-activation, GELU alone; the bias holds a NaN, infinities, a bf16 denormal and -0.
TEST(Bf16Gemm, FusedEpilogueIsBitwiseTheUnfusedOps) {
  struct Variant {
    bool bias, bias_first, activation, keep_pre;
  };
  const Variant variants[] = {
      {true, false, true, true}, {true, false, false, false}, {true, true, true, false}, {false, false, true, true}};
  for (Bf16Kernel kernel : kernels_here()) {
    for (const Case& c : kCases) {
      const MatmulShape s = shape_of(c);
      Buf a(DType::BFloat16, uniform(static_cast<size_t>(c.m * c.k), -1, 1, 821));
      Buf b(DType::BFloat16, uniform(static_cast<size_t>(c.k * c.n), -1, 1, 822));
      std::vector<double> bias_values = uniform(static_cast<size_t>(c.n), -2, 2, 823);
      const double specials[] = {std::nan(""), HUGE_VAL, -HUGE_VAL, std::ldexp(1.0, -133), -0.0};
      for (size_t i = 0; i < std::size(specials) && i < bias_values.size(); ++i) bias_values[i * 7 % c.n] = specials[i];
      Buf bias(DType::BFloat16, bias_values);
      const auto* ap = static_cast<const bfloat16*>(a.data());
      const auto* bp = static_cast<const bfloat16*>(b.data());
      Buf product(DType::BFloat16, c.m * c.n);
      matmul_bf16(kernel, s, ap, bp, static_cast<bfloat16*>(product.data()));
      for (const Variant& v : variants) {
        Buf sum(DType::BFloat16, c.m * c.n), want(DType::BFloat16, c.m * c.n);
        for (int64_t i = 0; i < c.m; ++i) {
          const size_t at = static_cast<size_t>(i * c.n) * sizeof(bfloat16);
          auto* row = static_cast<unsigned char*>(product.data()) + at;
          auto* sum_row = static_cast<unsigned char*>(sum.data()) + at;
          if (!v.bias)
            std::memcpy(sum_row, row, static_cast<size_t>(c.n) * sizeof(bfloat16));
          else if (v.bias_first)
            binary_span(BinaryOp::Add, DType::BFloat16, bias.data(), 1, row, 1, sum_row, c.n);
          else
            binary_span(BinaryOp::Add, DType::BFloat16, row, 1, bias.data(), 1, sum_row, c.n);
          auto* want_row = static_cast<unsigned char*>(want.data()) + at;
          if (v.activation)
            unary_span(UnaryOp::GeluTanh, DType::BFloat16, sum_row, want_row, c.n);
          else
            std::memcpy(want_row, sum_row, static_cast<size_t>(c.n) * sizeof(bfloat16));
        }
        Buf got(DType::BFloat16, c.m * c.n), got_sum(DType::BFloat16, c.m * c.n);
        GemmEpilogue e;
        e.bias = v.bias ? bias.data() : nullptr;
        e.bias_first = v.bias_first;
        e.has_activation = v.activation;
        e.activation = UnaryOp::GeluTanh;
        e.pre_activation = v.keep_pre ? got_sum.data() : nullptr;
        matmul_bf16(kernel, s, ap, bp, static_cast<bfloat16*>(got.data()), &e);
        const std::string where = std::string(bf16_kernel_name(kernel)) + " m=" + std::to_string(c.m) +
                                  " n=" + std::to_string(c.n) + " bias=" + std::to_string(v.bias) +
                                  " bias_first=" + std::to_string(v.bias_first) +
                                  " activation=" + std::to_string(v.activation);
        EXPECT_TRUE(got.bitwise_equal(want)) << where;
        if (v.keep_pre) {
          EXPECT_TRUE(got_sum.bitwise_equal(sum)) << "pre-activation " << where;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
