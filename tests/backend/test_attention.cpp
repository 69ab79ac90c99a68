// Tiled attention kernels vs a naive float64 reference that materializes the score
// matrix: forward (out, lse) and the analytical backward (dq, dk, dv).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/kernels/attention.h"
#include "backend/cpu/kernels/attention_avx512bf16.h"
#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_avx512bf16.h"
#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { None, Full, BroadcastHeads, BroadcastBatch, SomeRowsEmpty };

struct Problem {
  AttentionShape shape;
  std::vector<double> q, k, v, dout;
  std::vector<uint8_t> mask;
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

std::vector<double> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

Problem make_problem(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S, int64_t D, bool causal, MaskKind mk,
                     uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  auto& sh = p.shape;
  sh.batch = B, sh.heads = H, sh.kv_heads = Hkv, sh.q_len = T, sh.kv_len = S, sh.head_dim = D;
  sh.causal = causal;
  sh.scale = D > 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : 1.0;
  p.q = randn(B * H * T * D, rng);
  p.k = randn(B * Hkv * S * D, rng);
  p.v = randn(B * Hkv * S * D, rng);
  p.dout = randn(B * H * T * D, rng);
  if (mk != MaskKind::None) {
    // Stored mask of shape [mb, mh, T, S]; a size-1 dim is broadcast with stride 0.
    const int64_t mb = mk == MaskKind::BroadcastBatch ? 1 : B;
    const int64_t mh = mk == MaskKind::BroadcastHeads || mk == MaskKind::BroadcastBatch ? 1 : H;
    std::bernoulli_distribution keep(0.7);
    p.mask.resize(mb * mh * T * S);
    for (auto& m : p.mask) m = keep(rng);
    if (mk == MaskKind::SomeRowsEmpty)
      for (int64_t r = 0; r < mb * mh * T; r += 3) std::fill_n(p.mask.begin() + r * S, S, uint8_t{0});
    sh.mask = p.mask.data();
    sh.mask_b_stride = mb == 1 ? 0 : mh * T * S;
    sh.mask_h_stride = mh == 1 ? 0 : T * S;
  }
  return p;
}

bool visible(const AttentionShape& sh, int64_t b, int64_t h, int64_t t, int64_t s) {
  if (sh.causal && s > t) return false;
  if (sh.mask == nullptr) return true;
  const auto* m = static_cast<const uint8_t*>(sh.mask);
  return m[b * sh.mask_b_stride + h * sh.mask_h_stride + t * sh.kv_len + s] != 0;
}

// Materialized softmax(scale Q K^T) V and its analytical gradient, all in float64.
Result reference(const Problem& p) {
  const auto& sh = p.shape;
  const int64_t B = sh.batch, H = sh.heads, Hkv = sh.kv_heads, T = sh.q_len, S = sh.kv_len, D = sh.head_dim;
  Result r;
  r.out.assign(B * H * T * D, 0.0);
  r.lse.assign(B * H * T, -kInf);
  r.dq.assign(B * H * T * D, 0.0);
  r.dk.assign(B * Hkv * S * D, 0.0);
  r.dv.assign(B * Hkv * S * D, 0.0);
  std::vector<double> prob(S), dprob(S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kvh = h / (H / Hkv);
        const double* qt = p.q.data() + ((b * H + h) * T + t) * D;
        const double* go = p.dout.data() + ((b * H + h) * T + t) * D;
        const double* kb = p.k.data() + (b * Hkv + kvh) * S * D;
        const double* vb = p.v.data() + (b * Hkv + kvh) * S * D;
        double mx = -kInf;
        for (int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qt[d] * kb[s * D + d];
          prob[s] = visible(sh, b, h, t, s) ? sh.scale * dot : -kInf;
          mx = std::max(mx, prob[s]);
        }
        if (mx == -kInf) continue;  // no visible key: out 0, lse -inf, no gradient
        double sum = 0;
        for (int64_t s = 0; s < S; ++s) sum += prob[s] = std::exp(prob[s] - mx);
        for (int64_t s = 0; s < S; ++s) prob[s] /= sum;
        r.lse[(b * H + h) * T + t] = mx + std::log(sum);
        double* ot = r.out.data() + ((b * H + h) * T + t) * D;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < D; ++d) ot[d] += prob[s] * vb[s * D + d];
        double c = 0;
        for (int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += go[d] * vb[s * D + d];
          dprob[s] = dot;
          c += prob[s] * dot;
        }
        double* dqt = r.dq.data() + ((b * H + h) * T + t) * D;
        for (int64_t s = 0; s < S; ++s) {
          const double ds = prob[s] * (dprob[s] - c) * sh.scale;
          double* dks = r.dk.data() + ((b * Hkv + kvh) * S + s) * D;
          double* dvs = r.dv.data() + ((b * Hkv + kvh) * S + s) * D;
          for (int64_t d = 0; d < D; ++d) {
            dqt[d] += ds * kb[s * D + d];
            dks[d] += ds * qt[d];
            dvs[d] += prob[s] * go[d];
          }
        }
      }
  return r;
}

template <typename E>
std::vector<E> to_dtype(const std::vector<double>& x) {
  std::vector<E> y(x.size());
  convert(DType::Float64, x.data(), dtype_v<E>, y.data(), static_cast<int64_t>(x.size()));
  return y;
}

template <typename E>
std::vector<double> to_double(const std::vector<E>& x) {
  std::vector<double> y(x.size());
  convert(dtype_v<E>, x.data(), DType::Float64, y.data(), static_cast<int64_t>(x.size()));
  return y;
}

// Runs the kernels with element type E on the problem (inputs rounded to E).
template <typename E>
Result run_kernels(const Problem& p) {
  using L = std::conditional_t<std::is_same_v<E, double>, double, float>;
  const auto& sh = p.shape;
  auto q = to_dtype<E>(p.q), k = to_dtype<E>(p.k), v = to_dtype<E>(p.v), dout = to_dtype<E>(p.dout);
  std::vector<E> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<L> lse(sh.batch * sh.heads * sh.q_len);
  attention_forward(dtype_v<E>, sh, q.data(), k.data(), v.data(), out.data(), lse.data());
  attention_backward(dtype_v<E>, sh, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                     dk.data(), dv.data());
  Result r{to_double(out), std::vector<double>(lse.begin(), lse.end()), to_double(dq), to_double(dk), to_double(dv)};
  return r;
}

// max |got - want| <= tol * max(1, max |want|), with -inf matched exactly.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1, err = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
      continue;
    }
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    err = std::max(err, std::abs(got[i] - want[i]));
  }
  EXPECT_LE(err, tol * scale) << what;
}

// Every output of `a` equal to `b`'s, element by element.
void expect_bitwise_equal(const Result& a, const Result& b) {
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

// Every output of `got` against `want` as expect_close.
void expect_all_close(const Result& got, const Result& want, double tol) {
  expect_close(got.out, want.out, tol, "out");
  expect_close(got.lse, want.lse, tol, "lse");
  expect_close(got.dq, want.dq, tol, "dq");
  expect_close(got.dk, want.dk, tol, "dk");
  expect_close(got.dv, want.dv, tol, "dv");
}

template <typename E>
void check(const Problem& p, double tol) {
  // The reference sees the same rounded inputs as the kernel.
  Problem rounded = p;
  rounded.q = to_double(to_dtype<E>(p.q));
  rounded.k = to_double(to_dtype<E>(p.k));
  rounded.v = to_double(to_dtype<E>(p.v));
  rounded.dout = to_double(to_dtype<E>(p.dout));
  const Result want = reference(rounded);
  const Result got = run_kernels<E>(p);
  expect_all_close(got, want, tol);
}

struct Case {
  int64_t B, H, Hkv, T, S, D;
  bool causal;
  MaskKind mask;
};

const Case kCases[] = {
    {1, 1, 1, 1, 1, 8, false, MaskKind::None},
    {1, 1, 1, 1, 1, 8, true, MaskKind::None},
    {2, 2, 2, 7, 7, 8, true, MaskKind::None},
    {1, 2, 2, 65, 65, 64, true, MaskKind::None},
    {1, 2, 2, 130, 130, 64, true, MaskKind::None},
    {1, 2, 2, 130, 130, 64, false, MaskKind::None},
    {2, 4, 2, 65, 65, 80, true, MaskKind::None},
    {1, 4, 1, 130, 130, 8, true, MaskKind::None},
    {1, 2, 1, 7, 130, 64, false, MaskKind::None},
    {1, 2, 2, 130, 7, 80, false, MaskKind::None},
    {2, 2, 1, 65, 33, 8, false, MaskKind::Full},
    {2, 4, 2, 70, 70, 8, true, MaskKind::BroadcastHeads},
    {2, 2, 2, 66, 130, 8, false, MaskKind::BroadcastBatch},
    {2, 2, 1, 65, 65, 8, true, MaskKind::SomeRowsEmpty},
    {1, 1, 1, 5, 0, 8, false, MaskKind::None},
    {1, 1, 1, 0, 9, 8, false, MaskKind::None},
    {0, 1, 1, 4, 4, 8, true, MaskKind::None},
};

TEST(Attention, Float32MatchesReference) {
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " H=" << c.H << " Hkv=" << c.Hkv << " T=" << c.T << " S=" << c.S
                                    << " D=" << c.D << " causal=" << c.causal << " mask=" << static_cast<int>(c.mask));
    check<float>(make_problem(c.B, c.H, c.Hkv, c.T, c.S, c.D, c.causal, c.mask, seed++), 1e-5);
  }
}

TEST(Attention, Float64MatchesReference) {
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " H=" << c.H << " Hkv=" << c.Hkv << " T=" << c.T << " S=" << c.S
                                    << " D=" << c.D << " causal=" << c.causal << " mask=" << static_cast<int>(c.mask));
    check<double>(make_problem(c.B, c.H, c.Hkv, c.T, c.S, c.D, c.causal, c.mask, seed++), 1e-12);
  }
}

TEST(Attention, HalfPrecisionMatchesReference) {
  // Computed in float32 from the rounded inputs; the tolerance covers rounding the outputs.
  const Problem p = make_problem(2, 4, 2, 70, 70, 64, true, MaskKind::None, 7);
  check<bfloat16>(p, 1e-2);
  check<float16>(p, 2e-3);
}

// The AVX512-BF16 kernels (attention_avx512bf16.h) called directly, whatever
// attention_forward picks: bf16 operands, float32 accumulation, P and dS rounded to
// bf16. The bound, as for the float32-computing bf16 kernels above: out, lse and the
// gradients within 1% of max |value| of the float64 reference on the same rounded
// inputs (one bf16 rounding is 2^-9 relative; the sums of rounded P and dS over up to
// 130 keys or queries grow it; 4e-3 is exceeded).
Result run_avx512bf16(const Problem& p) {
  const auto& sh = p.shape;
  auto q = to_dtype<bfloat16>(p.q), k = to_dtype<bfloat16>(p.k), v = to_dtype<bfloat16>(p.v),
       dout = to_dtype<bfloat16>(p.dout);
  std::vector<bfloat16> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(sh.batch * sh.heads * sh.q_len);
  attention_forward_avx512bf16(sh, q.data(), k.data(), v.data(), out.data(), lse.data());
  attention_backward_avx512bf16(sh, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                dk.data(), dv.data());
  return {to_double(out), std::vector<double>(lse.begin(), lse.end()), to_double(dq), to_double(dk), to_double(dv)};
}

bool skip_without_avx512bf16() {
  const char* why = "";
  if (avx512bf16_usable(&why)) return false;
  std::printf("skipped: %s\n", why);
  return true;
}

TEST(Attention, Avx512Bf16MatchesReference) {
  if (skip_without_avx512bf16()) GTEST_SKIP() << "the CPU cannot run the AVX512-BF16 kernels";
  uint32_t seed = 200;
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " H=" << c.H << " Hkv=" << c.Hkv << " T=" << c.T << " S=" << c.S
                                    << " D=" << c.D << " causal=" << c.causal << " mask=" << static_cast<int>(c.mask));
    const Problem p = make_problem(c.B, c.H, c.Hkv, c.T, c.S, c.D, c.causal, c.mask, seed++);
    Problem rounded = p;
    for (auto* x : {&rounded.q, &rounded.k, &rounded.v, &rounded.dout}) *x = to_double(to_dtype<bfloat16>(*x));
    const Result want = reference(rounded);
    const Result got = run_avx512bf16(p);
    expect_all_close(got, want, 1e-2);
  }
}

// Odd head dims (copied rows, a half pair), a head dim past one register block (96
// columns), odd query and key counts, segment ids: the operand layouts' edge cases.
TEST(Attention, Avx512Bf16LayoutEdgeCases) {
  if (skip_without_avx512bf16()) GTEST_SKIP() << "the CPU cannot run the AVX512-BF16 kernels";
  const int64_t dims[][3] = {{67, 67, 7}, {131, 131, 96}, {33, 97, 5}, {64, 64, 1}, {129, 129, 65}};
  uint32_t seed = 300;
  for (const auto& [T, S, D] : dims)
    for (bool causal : {false, true}) {
      if (causal && T != S) continue;
      SCOPED_TRACE(testing::Message() << "T=" << T << " S=" << S << " D=" << D << " causal=" << causal);
      Problem p = make_problem(1, 2, 1, T, S, D, causal, MaskKind::None, seed++);
      std::vector<int32_t> segments;
      if (T == S && T % 2 == 1) {  // two documents, the boundary inside a block
        segments.assign(T, 0);
        std::fill(segments.begin() + T / 3, segments.end(), 1);
        p.shape.segments = segments.data();
      }
      Problem rounded = p;
      for (auto* x : {&rounded.q, &rounded.k, &rounded.v, &rounded.dout}) *x = to_double(to_dtype<bfloat16>(*x));
      // The reference's visibility has no segment test: compare against the float32
      // kernel instead when there are documents (it is checked against the reference above).
      const Result want = segments.empty() ? reference(rounded) : run_kernels<float>(rounded);
      const Result got = run_avx512bf16(p);
      expect_all_close(got, want, 1e-2);
    }
}

TEST(Attention, Avx512Bf16BitwiseIdenticalAcrossThreadCounts) {
  if (skip_without_avx512bf16()) GTEST_SKIP() << "the CPU cannot run the AVX512-BF16 kernels";
  const int saved = num_threads();
  for (const Problem& p : {make_problem(2, 4, 2, 130, 130, 64, true, MaskKind::None, 41),
                           make_problem(1, 2, 1, 200, 200, 64, false, MaskKind::None, 42)}) {
    set_num_threads(1);
    const Result one = run_avx512bf16(p);
    set_num_threads(2);
    const Result two = run_avx512bf16(p);
    expect_bitwise_equal(one, two);
  }
  set_num_threads(saved);
}

// attention_forward / attention_backward take these kernels for bfloat16 exactly when
// attention_bf16_native() says so (else the float32-computing tiles, which differ in
// the last bits).
TEST(Attention, Bf16DispatchFollowsTheBf16GemmPath) {
  EXPECT_EQ(attention_bf16_native(), bf16_gemm_path().native && avx512bf16_usable());
  if (!attention_bf16_native()) GTEST_SKIP() << "bfloat16 attention computes in float32 here";
  const Problem p = make_problem(2, 4, 2, 70, 70, 64, true, MaskKind::None, 51);
  const Result direct = run_avx512bf16(p);
  const Result dispatched = run_kernels<bfloat16>(p);
  expect_bitwise_equal(direct, dispatched);
}

TEST(Attention, FullyMaskedRowsGiveZeroAndNegInf) {
  Problem p = make_problem(1, 2, 1, 20, 20, 8, false, MaskKind::Full, 11);
  std::fill_n(p.mask.begin() + 3 * 20, 20, uint8_t{0});  // head 0, query 3 sees nothing
  const Result got = run_kernels<float>(p);
  EXPECT_EQ(got.lse[3], -kInf);
  for (int64_t d = 0; d < 8; ++d) {
    EXPECT_EQ(got.out[3 * 8 + d], 0.0);
    EXPECT_EQ(got.dq[3 * 8 + d], 0.0);
  }
  for (double x : got.dk) EXPECT_TRUE(std::isfinite(x));
  for (double x : got.dv) EXPECT_TRUE(std::isfinite(x));
}

// d/dx of sum(out * W) by central differences, against the float64 backward.
TEST(Attention, Float64GradientMatchesFiniteDifferences) {
  Problem p = make_problem(1, 2, 1, 5, 5, 3, true, MaskKind::None, 21);
  p.shape.scale = 0.7;
  const Result got = run_kernels<double>(p);  // p.dout plays W
  auto loss = [&](const Problem& pp) {
    const Result r = run_kernels<double>(pp);
    double sum = 0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * pp.dout[i];
    return sum;
  };
  const double eps = 1e-6;
  auto check_grad = [&](std::vector<double> Problem::*field, const std::vector<double>& grad, const char* what) {
    for (size_t i = 0; i < grad.size(); ++i) {
      Problem plus = p, minus = p;
      (plus.*field)[i] += eps;
      (minus.*field)[i] -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      EXPECT_NEAR(grad[i], numeric, 1e-8) << what << "[" << i << "]";
    }
  };
  check_grad(&Problem::q, got.dq, "dq");
  check_grad(&Problem::k, got.dk, "dk");
  check_grad(&Problem::v, got.dv, "dv");
}

TEST(Attention, BitwiseIdenticalAcrossThreadCounts) {
  const int saved = num_threads();
  // Many (b, kv head) groups, and one group whose key blocks are split across tasks.
  for (const Problem& p : {make_problem(2, 4, 2, 130, 130, 64, true, MaskKind::None, 31),
                           make_problem(1, 2, 1, 200, 200, 64, false, MaskKind::None, 32)}) {
    set_num_threads(1);
    const Result one = run_kernels<float>(p);
    set_num_threads(2);
    const Result two = run_kernels<float>(p);
    expect_bitwise_equal(one, two);
  }
  set_num_threads(saved);
}

TEST(Attention, RejectsBadArguments) {
  AttentionShape sh;
  sh.heads = 3, sh.kv_heads = 2, sh.q_len = 1, sh.kv_len = 1, sh.head_dim = 1;
  float x = 0, y = 0;
  EXPECT_THROW(attention_forward(DType::Float32, sh, &x, &x, &x, &y, &y), ShapeError);
  sh.heads = 2;
  EXPECT_THROW(attention_forward(DType::Int32, sh, &x, &x, &x, &y, &y), DTypeError);
  sh.q_len = -1;
  EXPECT_THROW(attention_forward(DType::Float32, sh, &x, &x, &x, &y, &y), ValueError);
  sh.q_len = 1;
  EXPECT_THROW(attention_forward(DType::Float32, sh, nullptr, &x, &x, &y, &y), ValueError);
}

}  // namespace
}  // namespace tessera::cpu
