// The CUDA GEMMs (backend/cuda/kernels/gemm.h through eval_linalg.cpp) against the CPU
// backend: matmul and matmul_epilogue over odd shapes (1, 7, 33, 769 and the GPT-2
// vocabulary 50257), every transpose combination, batch folding / strided / shared
// operands, every epilogue, float32 / bfloat16 / float16 / float64 and integers; the
// fallback kernel and the heuristic-only mode; and the algorithm cache's text round
// trip (the part that needs no GPU runs everywhere).
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gemm.h"
#include "backend/cuda/kernels/gemm_algo_cache.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/matmul_epilogue.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;
using ts::cuda_test::rel_error;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 1000;
  return ++seed;
}

Array random_array(const Shape& shape, DType dtype, float scale = 1.0f) {
  Array x = Array::from_vector(ts::cuda_test::random_floats(static_cast<size_t>(ts::numel(shape)), next_seed(), scale),
                               shape);
  if (dtype != DType::Float32) x = ts::astype(x, dtype);
  x.eval();  // the GPU and the CPU reference read the same (rounded) values
  return x;
}

std::vector<float> values(const Array& a) { return a.to_vector<float>(); }

double tolerance(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16 ? ts::cuda_test::kBf16Tolerance
                                                             : ts::cuda_test::kF32Tolerance;
}

std::string describe(const Array& a, const Array& b, bool ta, bool tb) {
  return ts::type_string(a) + " x " + ts::type_string(b) + " trans_a=" + std::to_string(ta) +
         " trans_b=" + std::to_string(tb);
}

// Runs every output of `lazy`'s primitive on the GPU and compares each with the CPU.
void expect_matches_cpu(const Array& lazy, double tol, const std::string& what) {
  std::vector<Array> gpu = ts::cuda::run_on_gpu(lazy);
  std::vector<Array> ref = lazy.siblings();
  ts::eval(ref);
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(gpu[i].shape(), ref[i].shape()) << what;
    EXPECT_LT(rel_error(values(gpu[i]), values(ref[i])), tol) << what << " output " << i;
  }
}

// A [.., m, k] operand (or [.., k, m] when transposed).
Shape operand(const Shape& batch, int64_t rows, int64_t cols, bool trans) {
  Shape s = batch;
  s.push_back(trans ? cols : rows);
  s.push_back(trans ? rows : cols);
  return s;
}

// float32 sums of k random terms carry a rounding error that grows like sqrt(k) on each
// side (a GPU kernel may accumulate the whole reduction sequentially per output): the
// 1e-5 tolerance holds up to k = 4096 and scales with sqrt(k / 4096) beyond (the
// 50257-long reductions of the LM head's gradient: 3.5e-5).
double gemm_tolerance(DType dtype, int64_t k) {
  const double t = tolerance(dtype);
  if (dtype == DType::BFloat16 || dtype == DType::Float16 || k <= 4096) return t;
  return t * std::sqrt(static_cast<double>(k) / 4096.0);
}

void check_matmul(DType dtype, const Shape& batch_a, const Shape& batch_b, int64_t m, int64_t k, int64_t n, bool ta,
                  bool tb) {
  Array a = random_array(operand(batch_a, m, k, ta), dtype);
  Array b = random_array(operand(batch_b, k, n, tb), dtype);
  Array y = ts::matmul_op(a, b, ta, tb);
  expect_matches_cpu(y, gemm_tolerance(dtype, k), describe(a, b, ta, tb));
}

struct Mkn {
  int64_t m, k, n;
};
const std::vector<Mkn> kOddShapes = {{1, 1, 1}, {7, 33, 1}, {1, 7, 33}, {33, 7, 769}, {769, 33, 7}, {129, 65, 33}};

void check_odd_shapes(DType dtype) {
  for (const Mkn& s : kOddShapes)
    for (int t = 0; t < 4; ++t) check_matmul(dtype, {}, {}, s.m, s.k, s.n, t & 1, t & 2);
}

// Restores the GEMM options a test changed.
struct OptionsGuard {
  ts::cuda::GemmOptions saved = ts::cuda::gemm_options();
  ~OptionsGuard() { ts::cuda::set_gemm_options(saved); }
};

// The epilogue's primary output; a bias input exactly when `bias` is given.
Array epilogue_op(ts::MatmulEpilogue::Options o, const Array& a, const Array& b, const Array* bias) {
  o.bias = bias != nullptr;
  if (!o.bias) o.bias_first = false;
  Shape out =
      a.ndim() > 2 ? Shape(a.shape().begin(), a.shape().end() - 2) : Shape(b.shape().begin(), b.shape().end() - 2);
  out.push_back(a.shape(o.trans_a ? -1 : -2));
  out.push_back(b.shape(o.trans_b ? -2 : -1));
  std::vector<Shape> shapes{out};
  std::vector<DType> dtypes{a.dtype()};
  if (o.pre_activation) {
    shapes.push_back(out);
    dtypes.push_back(a.dtype());
  }
  std::vector<Array> inputs{a, b};
  if (bias) inputs.push_back(*bias);
  return Array::make(shapes, dtypes, std::make_shared<ts::MatmulEpilogue>(o), inputs)[0];
}

}  // namespace

TEST(CudaGemm, Float32OddShapesAndTransposes) {
  TESSERA_REQUIRE_GPU();
  check_odd_shapes(DType::Float32);
}

TEST(CudaGemm, BFloat16OddShapesAndTransposes) {
  TESSERA_REQUIRE_GPU();
  check_odd_shapes(DType::BFloat16);
}

TEST(CudaGemm, Float16AndFloat64) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float16, DType::Float64}) {
    check_matmul(dtype, {}, {}, 33, 7, 769, false, false);
    check_matmul(dtype, {}, {}, 7, 65, 33, true, true);
    check_matmul(dtype, {3}, {3}, 5, 9, 7, false, true);
  }
}

TEST(CudaGemm, BatchFoldedStridedAndShared) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    // [B, T, K] x [K, N]: one [B*T, K] x [K, N] GEMM.
    check_matmul(dtype, {3}, {}, 7, 33, 65, false, false);
    EXPECT_TRUE(ts::cuda::last_gemm_report().folded);
    check_matmul(dtype, {2, 3}, {}, 7, 33, 65, false, true);
    EXPECT_TRUE(ts::cuda::last_gemm_report().folded);
    // A transposed batched A cannot fold: strided batch with a shared B.
    check_matmul(dtype, {3}, {}, 7, 33, 65, true, false);
    EXPECT_FALSE(ts::cuda::last_gemm_report().folded);
    // Shared A, batched B; both batched (attention-like), with transposes.
    for (int t = 0; t < 4; ++t) {
      check_matmul(dtype, {}, {4}, 7, 33, 5, t & 1, t & 2);
      check_matmul(dtype, {2, 3}, {2, 3}, 17, 8, 9, t & 1, t & 2);
    }
  }
}

TEST(CudaGemm, VocabularyWidth50257) {
  TESSERA_REQUIRE_GPU();
  // The GPT-2 LM head: x [T, C] @ wte[V, C]^T, V = 50257 (odd row stride of the output).
  // bf16 rows of 50257 elements are not 16-byte aligned: that dimension is zero-padded
  // and the matrices that have it restaged (gemm.h), which the report shows (1 = A,
  // 2 = B, 4 = C); float32 needs none of it.
  auto staged = [](DType dtype, int bits) { return dtype == DType::BFloat16 ? bits : 0; };
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    check_matmul(dtype, {}, {}, 9, 64, 50257, false, true);  // n padded: B, C
    EXPECT_EQ(ts::cuda::last_gemm_report().staged, staged(dtype, 2 | 4));
    check_matmul(dtype, {2}, {}, 5, 64, 50257, false, true);
    EXPECT_EQ(ts::cuda::last_gemm_report().staged, staged(dtype, 2 | 4));
    // Its gradients: dx = dlogits @ wte (k padded: A, B), dwte = dlogits^T @ x (m: A, C).
    check_matmul(dtype, {}, {}, 9, 50257, 64, false, false);
    EXPECT_EQ(ts::cuda::last_gemm_report().staged, staged(dtype, 1 | 2));
    check_matmul(dtype, {}, {}, 50257, 9, 64, true, false);
    EXPECT_EQ(ts::cuda::last_gemm_report().staged, staged(dtype, 1 | 4));
    check_matmul(dtype, {}, {}, 64, 9, 50257, true, false);  // n padded: B, C
    EXPECT_EQ(ts::cuda::last_gemm_report().staged, staged(dtype, 2 | 4));
    check_matmul(dtype, {}, {}, 33, 37, 41, true, true);  // every dimension odd
    EXPECT_EQ(ts::cuda::last_gemm_report().staged, staged(dtype, 1 | 2 | 4));
    EXPECT_EQ(ts::cuda::last_gemm_report().path, ts::cuda::GemmPath::CublasLt);
  }
}

TEST(CudaGemm, EmptyAndZeroK) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    check_matmul(dtype, {}, {}, 0, 7, 5, false, false);
    check_matmul(dtype, {}, {}, 7, 0, 5, false, false);
    EXPECT_EQ(ts::cuda::last_gemm_report().path, ts::cuda::GemmPath::ZeroK);
    check_matmul(dtype, {0}, {}, 3, 4, 5, false, false);
  }
}

TEST(CudaGemm, IntegersUseTheTiledKernel) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Int32, DType::Int64, DType::Int8}) {
    std::vector<float> av(7 * 33), bv(33 * 5);
    for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<float>(static_cast<int>(i * 7 % 11) - 5);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<float>(static_cast<int>(i * 5 % 13) - 6);
    Array a = ts::astype(Array::from_vector(av, {7, 33}), dtype);
    Array b = ts::astype(Array::from_vector(bv, {33, 5}), dtype);
    a.eval();
    b.eval();
    Array y = ts::matmul_op(a, b, false, false);
    std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
    EXPECT_EQ(ts::cuda::last_gemm_report().path, ts::cuda::GemmPath::Reference);
    EXPECT_EQ(gpu[0].to_vector<int64_t>(), y.to_vector<int64_t>()) << ts::name(dtype);
  }
}

TEST(CudaGemm, IntegerEpilogue) {
  TESSERA_REQUIRE_GPU();
  std::vector<int32_t> av(9 * 13), bv(13 * 6), biasv(6);
  for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<int32_t>(i * 7 % 11) - 5;
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<int32_t>(i * 5 % 13) - 6;
  for (size_t i = 0; i < biasv.size(); ++i) biasv[i] = static_cast<int32_t>(i * 3) - 8;
  Array a = Array::from_vector(av, {9, 13});
  Array b = Array::from_vector(bv, {13, 6});
  Array bias = Array::from_vector(biasv, {6});
  for (bool relu : {false, true}) {
    ts::MatmulEpilogue::Options o;
    if (relu) o.activation = ts::UnaryKind::Relu;
    Array y = epilogue_op(o, a, b, &bias);
    std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
    EXPECT_EQ(gpu[0].to_vector<int64_t>(), y.to_vector<int64_t>()) << "relu=" << relu;
  }
}

TEST(CudaGemm, FallbackKernelAndHeuristicOnlyMatch) {
  TESSERA_REQUIRE_GPU();
  OptionsGuard guard;
  ts::cuda::GemmOptions o = guard.saved;
  o.reference_only = true;
  ts::cuda::set_gemm_options(o);
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    check_matmul(dtype, {}, {}, 33, 65, 17, true, true);
    EXPECT_EQ(ts::cuda::last_gemm_report().path, ts::cuda::GemmPath::Reference);
    check_matmul(dtype, {3}, {3}, 17, 9, 33, false, true);
    check_matmul(dtype, {}, {2}, 7, 9, 5, true, false);
  }
  o.reference_only = false;
  o.autotune = false;  // TESSERA_GEMM_AUTOTUNE=0
  ts::cuda::set_gemm_options(o);
  ts::cuda::gemm_algo_cache().clear();
  check_matmul(DType::Float32, {}, {}, 65, 33, 129, false, true);
  EXPECT_EQ(ts::cuda::last_gemm_report().path, ts::cuda::GemmPath::CublasLt);
  EXPECT_FALSE(ts::cuda::last_gemm_report().tuned);
}

TEST(CudaGemm, EpiloguesMatchTheCpu) {
  TESSERA_REQUIRE_GPU();
  const ts::UnaryKind acts[] = {ts::UnaryKind::GeluTanh, ts::UnaryKind::GeluErf, ts::UnaryKind::Relu,
                                ts::UnaryKind::Silu,     ts::UnaryKind::Tanh,    ts::UnaryKind::Sigmoid};
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
    // n = 64 allows cuBLASLt's GELU_AUX (pre-activation output); n = 33 does not.
    for (int64_t n : {64, 33}) {
      Array a = random_array({2, 9, 48}, dtype);  // folded batch
      Array b = random_array({48, n}, dtype, 0.3f);
      Array bias = random_array({n}, dtype);
      Array bias_row = random_array({1, n}, dtype);
      for (int variant = 0; variant < 3; ++variant) {
        ts::MatmulEpilogue::Options o;
        o.bias = true;
        o.bias_first = variant == 2;
        const Array& bb = variant == 1 ? bias_row : bias;
        expect_matches_cpu(epilogue_op(o, a, b, &bb), tolerance(dtype), "bias only " + ts::type_string(a));
      }
      for (ts::UnaryKind act : acts) {
        for (int flags = 0; flags < 4; ++flags) {
          ts::MatmulEpilogue::Options o;
          o.bias = flags & 1;
          o.pre_activation = flags & 2;
          o.activation = act;
          const std::string what = std::string(ts::unary_name(act)) + " bias=" + std::to_string(o.bias) +
                                   " pre=" + std::to_string(o.pre_activation) + " n=" + std::to_string(n) + " " +
                                   std::string(ts::name(dtype));
          expect_matches_cpu(epilogue_op(o, a, b, o.bias ? &bias : nullptr), tolerance(dtype), what);
        }
      }
    }
    // Transposed and truly batched operands with an epilogue.
    Array a = random_array({3, 33, 7}, dtype);
    Array b = random_array({3, 17, 33}, dtype);
    Array bias = random_array({17}, dtype);
    ts::MatmulEpilogue::Options o;
    o.trans_a = true;
    o.trans_b = true;
    o.activation = ts::UnaryKind::GeluTanh;
    o.pre_activation = true;
    expect_matches_cpu(epilogue_op(o, a, b, &bias), tolerance(dtype), "batched transposed gelu");
  }
}

TEST(CudaGemm, GeluEpilogueUsesCublasLtForHalfTypes) {
  TESSERA_REQUIRE_GPU();
  Array a = random_array({16, 64}, DType::BFloat16);
  Array b = random_array({64, 128}, DType::BFloat16, 0.3f);
  Array bias = random_array({128}, DType::BFloat16);
  ts::MatmulEpilogue::Options o;
  o.activation = ts::UnaryKind::GeluTanh;
  expect_matches_cpu(epilogue_op(o, a, b, &bias), ts::cuda_test::kBf16Tolerance, "bf16 gelu");
  const ts::cuda::GemmReport r = ts::cuda::last_gemm_report();
  // Either the fused GELU_BIAS epilogue ran, or (no algorithm for it) the unfused path.
  EXPECT_EQ(r.path, ts::cuda::GemmPath::CublasLt);
  if (!r.post_kernel) {
    EXPECT_NE(r.lt_epilogue, 1 /* CUBLASLT_EPILOGUE_DEFAULT */);
  }
}

// The backward's form, out = gelu_tanh_grad(x, a b^T) (matmul_epilogue activation_grad):
// cuBLASLt's DGELU epilogue for bf16/f16 with n % 8 == 0 (its product is not rounded
// before the multiply, so within the dtype's tolerance of the CPU, which rounds it), the
// product then the gelu_tanh_grad kernel elsewhere (n = 33, float32).
TEST(CudaGemm, GeluGradientEpilogueMatchesTheCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::BFloat16, DType::Float16, DType::Float32}) {
    for (int64_t n : {64, 33}) {
      Array a = random_array({2, 9, 48}, dtype);
      Array b = random_array({n, 48}, dtype, 0.3f);
      Array x = random_array({2, 9, n}, dtype);
      ts::MatmulEpilogue::Options o;
      o.bias = false;
      o.trans_b = true;
      o.activation_grad = ts::UnaryKind::GeluTanh;
      Array y = Array::make(Shape{2, 9, n}, dtype, std::make_shared<ts::MatmulEpilogue>(o), {a, b, x});
      const std::string what = "gelu_tanh_grad epilogue n=" + std::to_string(n) + " " + std::string(ts::name(dtype));
      expect_matches_cpu(y, tolerance(dtype), what);
      const ts::cuda::GemmReport r = ts::cuda::last_gemm_report();
      EXPECT_EQ(r.path, ts::cuda::GemmPath::CublasLt) << what;
      const bool dgelu = r.lt_epilogue == static_cast<int>(CUBLASLT_EPILOGUE_DGELU);
      EXPECT_EQ(dgelu, dtype != DType::Float32 && n % 8 == 0) << what << ": cuBLASLt epilogue " << r.lt_epilogue;
    }
  }
}

TEST(CudaGemm, AlgoCacheRoundTripReproducesTheChoices) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::GemmAlgoCache& cache = ts::cuda::gemm_algo_cache();
  cache.clear();
  Array a = random_array({65, 96}, DType::BFloat16);
  Array b = random_array({200, 96}, DType::BFloat16);
  Array y = ts::matmul_op(a, b, false, true);
  std::vector<Array> first = ts::cuda::run_on_gpu(y);
  ASSERT_GT(cache.size(), 0u);
  const std::string text = cache.serialize();

  ts::cuda::GemmAlgoCache copy;
  EXPECT_EQ(copy.deserialize(text), cache.size());
  EXPECT_EQ(copy.serialize(), text);

  // A fresh process's view: the saved choices are loaded, re-validated and reused, and
  // the product is bitwise the same.
  cache.clear();
  cache.deserialize(text);
  std::vector<Array> second = ts::cuda::run_on_gpu(y);
  EXPECT_FALSE(ts::cuda::last_gemm_report().tuned);
  EXPECT_EQ(cache.serialize(), text);
  const std::vector<float> v1 = values(first[0]), v2 = values(second[0]);
  ASSERT_EQ(v1.size(), v2.size());
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * sizeof(float)), 0);
}

// No GPU needed: the cache's text form.
TEST(CudaGemmAlgoCache, SerializeDeserializeRoundTrip) {
  ts::cuda::GemmAlgoCache cache;
  for (int i = 0; i < 5; ++i) {
    ts::cuda::GemmKey key;
    key.m = 7 + i;
    key.n = 50257;
    key.k = 768;
    key.batch = i + 1;
    key.a_batch_stride = i * 100;
    key.trans_b = i % 2;
    key.dtype = static_cast<int>(DType::BFloat16);
    key.compute = 68;
    key.epilogue = 1 + i;
    key.align_a = key.align_b = key.align_c = 256;
    key.align_bias = i % 2 ? 16 : 0;
    key.sm = 90;
    key.library = 130001;
    ts::cuda::GemmChoice c;
    for (int w = 0; w < 8; ++w) c.algo[w] = 0x0123456789abcdefULL * static_cast<uint64_t>(w + i + 1);
    c.workspace_bytes = static_cast<uint64_t>(i) << 20;
    c.time_us = i == 0 ? -1.0f : 12.345f * static_cast<float>(i);
    cache.insert(key, c);
  }
  const std::string text = cache.serialize();
  ts::cuda::GemmAlgoCache back;
  EXPECT_EQ(back.deserialize(text), 5u);
  EXPECT_EQ(back.serialize(), text);
  EXPECT_EQ(back.size(), 5u);
  ts::cuda::GemmKey probe;
  probe.m = 9;
  probe.n = 50257;
  probe.k = 768;
  probe.batch = 3;
  probe.a_batch_stride = 200;
  probe.dtype = static_cast<int>(DType::BFloat16);
  probe.compute = 68;
  probe.epilogue = 3;
  probe.align_a = probe.align_b = probe.align_c = 256;
  probe.sm = 90;
  probe.library = 130001;
  const auto found = back.find(probe);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, *cache.find(probe));
  EXPECT_FALSE(found->verified);  // re-checked before first use

  EXPECT_EQ(back.deserialize(""), 0u);
  EXPECT_THROW(back.deserialize("not a cache\n"), ts::ValueError);
  EXPECT_THROW(back.deserialize("tessera-gemm-algo-cache 1\n1 2 3 : 4\n"), ts::ValueError);
  EXPECT_EQ(back.size(), 5u);  // a malformed text merges nothing
}
