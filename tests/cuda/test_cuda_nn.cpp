// The fused NN kernels on the GPU (backend/cuda/eval_nn.cpp) against the CPU backend:
// softmax / log_softmax, layer / RMS norm and cross-entropy, forward and backward, over
// row lengths 1, 7, 768 and 50257 (odd lengths put row starts off the 16-byte grid, so
// the scalar heads and tails around the vector loads run), every float dtype, and
// ignored / out-of-range targets.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/nn.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;
using ts::cuda_test::rel_error;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 5000;
  return ++seed;
}

Array random_array(const Shape& shape, DType dtype, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v = ts::cuda_test::random_floats(static_cast<size_t>(ts::numel(shape)), next_seed(), scale);
  for (float& x : v) x += offset;
  Array x = Array::from_vector(v, shape);
  if (dtype != DType::Float32) x = ts::astype(x, dtype);
  x.eval();  // the GPU and the CPU read the same rounded values
  return x;
}

std::vector<float> values(const Array& a) { return a.to_vector<float>(); }

bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

// Outputs of the tensor's own dtype get its tolerance; float32 statistics (mean, rstd,
// lse, loss) are computed in float32 from identical inputs on both sides: 1e-5.
double tolerance(DType dtype) { return is_half(dtype) ? ts::cuda_test::kBf16Tolerance : ts::cuda_test::kF32Tolerance; }

std::vector<Array> make(const std::shared_ptr<ts::Primitive>& p, const std::vector<Shape>& shapes,
                        const std::vector<DType>& dtypes, const std::vector<Array>& inputs) {
  return Array::make(shapes, dtypes, p, inputs);
}

// Runs the primitive of outs[0] on the GPU; compares every output with the CPU.
std::vector<Array> expect_matches_cpu(const std::vector<Array>& outs, const std::string& what) {
  std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
  ts::eval(outs);
  EXPECT_EQ(gpu.size(), outs.size()) << what;
  for (size_t i = 0; i < outs.size() && i < gpu.size(); ++i) {
    EXPECT_EQ(gpu[i].shape(), outs[i].shape()) << what;
    EXPECT_LT(rel_error(values(gpu[i]), values(outs[i])), tolerance(outs[i].dtype())) << what << " output " << i;
  }
  return gpu;
}

// The inputs of a primitive, nullopt entries left out (built without an initializer
// list: GCC 12 reports a false -Warray-bounds for initializer-list vectors grown later).
std::vector<Array> inputs_of(std::initializer_list<std::optional<Array>> items) {
  std::vector<Array> out;
  out.reserve(items.size());
  for (const std::optional<Array>& a : items)
    if (a) out.push_back(*a);
  return out;
}

Shape lead_of(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

const DType kFloatTypes[] = {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64};
const int64_t kCols[] = {1, 7, 768, 50257};

int64_t rows_for(int64_t cols) { return cols > 10000 ? 3 : 5; }

}  // namespace

TEST(CudaSoftmax, ForwardMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (int64_t cols : kCols)
      for (bool log : {false, true}) {
        Array x = random_array({rows_for(cols), cols}, dtype, 3.0f);
        auto outs = make(std::make_shared<ts::Softmax>(log), {x.shape()}, {dtype}, {x});
        expect_matches_cpu(outs, std::string(log ? "log_softmax " : "softmax ") + ts::type_string(x));
      }
}

TEST(CudaSoftmax, RankThreeAndMaskedRows) {
  TESSERA_REQUIRE_GPU();
  // [2, 3, 33] rows, some -inf entries (a causal mask), one row starting with -inf.
  std::vector<float> v = ts::cuda_test::random_floats(2 * 3 * 33, next_seed(), 2.0f);
  for (size_t i = 0; i < v.size(); ++i)
    if ((i % 33) > 20 || (i % 33) == 0) v[i] = -INFINITY;
  Array x = Array::from_vector(v, {2, 3, 33});
  for (bool log : {false, true}) {
    auto outs = make(std::make_shared<ts::Softmax>(log), {x.shape()}, {DType::Float32}, {x});
    std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
    ts::eval(outs);
    const std::vector<float> g = values(gpu[0]), c = values(outs[0]);
    ASSERT_EQ(g.size(), c.size());
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::isinf(c[i])) {
        EXPECT_EQ(g[i], c[i]) << i;
      } else {
        EXPECT_NEAR(g[i], c[i], 1e-5 * (1 + std::fabs(c[i]))) << i;
      }
    }
  }
}

TEST(CudaSoftmax, BackwardMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (int64_t cols : kCols)
      for (bool log : {false, true}) {
        Array x = random_array({rows_for(cols), cols}, dtype, 2.0f);
        Array y = log ? ts::log_softmax(x, -1) : ts::softmax(x, -1);
        y.eval();
        Array dy = random_array(x.shape(), dtype);
        auto outs = make(std::make_shared<ts::SoftmaxGrad>(log), {x.shape()}, {dtype}, {y, dy});
        expect_matches_cpu(outs, std::string(log ? "log_softmax_grad " : "softmax_grad ") + ts::type_string(x));
      }
}

TEST(CudaNorm, ForwardMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (int64_t cols : kCols)
      for (bool rms : {false, true})
        for (int params = 0; params < 4; ++params) {
          const bool has_w = params & 1, has_b = !rms && (params & 2);
          if (rms && (params & 2)) continue;
          Array x = random_array({rows_for(cols), cols}, dtype, 2.0f, 0.5f);
          std::optional<Array> w, b;
          if (has_w) w = random_array({cols}, dtype, 0.5f, 1.0f);
          if (has_b) b = random_array({cols}, dtype);
          const std::vector<Array> in = inputs_of({x, w, b});
          const DType acc = ts::accumulation_dtype(dtype);
          std::vector<Shape> shapes{x.shape(), lead_of(x.shape())};
          std::vector<DType> dtypes{dtype, acc};
          if (!rms) {
            shapes.push_back(lead_of(x.shape()));
            dtypes.push_back(acc);
          }
          auto outs = make(std::make_shared<ts::Norm>(rms, has_w, has_b, rms ? 1e-6 : 1e-5), shapes, dtypes, in);
          expect_matches_cpu(outs, std::string(rms ? "rms_norm " : "layer_norm ") + ts::type_string(x) +
                                       " w=" + std::to_string(has_w) + " b=" + std::to_string(has_b));
        }
}

TEST(CudaNorm, BackwardMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  // 1100 rows: several rows per chunk (the chunked weight-gradient sums); 0 rows: zero dw/db.
  struct Case {
    int64_t rows, cols;
  };
  const Case cases[] = {{5, 1}, {5, 7}, {5, 768}, {3, 50257}, {1100, 96}, {0, 7}};
  for (DType dtype : kFloatTypes)
    for (const Case& c : cases)
      for (bool rms : {false, true})
        for (int params = 0; params < 4; ++params) {
          const bool has_w = params & 1, has_b = !rms && (params & 2);
          if (rms && (params & 2)) continue;
          if (c.rows == 0 && dtype != DType::Float32) continue;
          Array x = random_array({c.rows, c.cols}, dtype, 2.0f, 0.5f);
          std::optional<Array> w, b;
          if (has_w) w = random_array({c.cols}, dtype, 0.5f, 1.0f);
          if (has_b) b = random_array({c.cols}, dtype);
          // The saved statistics from the CPU forward.
          const DType acc = ts::accumulation_dtype(dtype);
          const std::vector<Array> fin = inputs_of({x, w, b});
          std::vector<Shape> fshapes{x.shape(), {c.rows}};
          std::vector<DType> fdtypes{dtype, acc};
          if (!rms) {
            fshapes.push_back({c.rows});
            fdtypes.push_back(acc);
          }
          auto fwd = make(std::make_shared<ts::Norm>(rms, has_w, has_b, 1e-5), fshapes, fdtypes, fin);
          ts::eval(fwd);
          Array dy = random_array(x.shape(), dtype);
          std::optional<Array> mean;
          if (!rms) mean = fwd[1];
          const std::vector<Array> in = inputs_of({x, w, mean, fwd[rms ? 1 : 2], dy});
          std::vector<Shape> shapes{x.shape()};
          std::vector<DType> dtypes{dtype};
          if (has_w) {
            shapes.push_back({c.cols});
            dtypes.push_back(dtype);
          }
          if (has_b) {
            shapes.push_back({c.cols});
            dtypes.push_back(dtype);
          }
          auto outs = make(std::make_shared<ts::NormGrad>(rms, has_w, has_b), shapes, dtypes, in);
          expect_matches_cpu(outs, std::string(rms ? "rms_norm_grad " : "layer_norm_grad ") + ts::type_string(x) +
                                       " w=" + std::to_string(has_w) + " b=" + std::to_string(has_b));
        }
}

TEST(CudaNorm, WeightGradientIsDeterministic) {
  TESSERA_REQUIRE_GPU();
  Array x = random_array({3000, 768}, DType::BFloat16, 1.0f);
  Array w = random_array({768}, DType::BFloat16, 0.5f, 1.0f);
  Array b = random_array({768}, DType::BFloat16);
  auto fwd = make(std::make_shared<ts::Norm>(false, true, true, 1e-5), {x.shape(), {3000}, {3000}},
                  {DType::BFloat16, DType::Float32, DType::Float32}, {x, w, b});
  ts::eval(fwd);
  Array dy = random_array(x.shape(), DType::BFloat16);
  auto outs = make(std::make_shared<ts::NormGrad>(false, true, true), {x.shape(), {768}, {768}},
                   {DType::BFloat16, DType::BFloat16, DType::BFloat16}, {x, w, fwd[1], fwd[2], dy});
  std::vector<Array> first = ts::cuda::run_on_gpu(outs[0]);
  for (int run = 0; run < 3; ++run) {
    std::vector<Array> again = ts::cuda::run_on_gpu(outs[0]);
    for (size_t i = 0; i < first.size(); ++i)
      EXPECT_EQ(again[i].to_vector<float>(), first[i].to_vector<float>()) << "output " << i;
  }
}

namespace {

Array random_targets(int64_t rows, int64_t vocab, int64_t ignore_index, bool with_ignored) {
  std::vector<int64_t> t(static_cast<size_t>(rows));
  const std::vector<float> u = ts::cuda_test::random_floats(t.size(), next_seed());
  for (size_t i = 0; i < t.size(); ++i) {
    const double frac = std::fabs(u[i]) - std::floor(std::fabs(u[i]));
    t[i] = static_cast<int64_t>(frac * static_cast<double>(vocab)) % vocab;
    if (with_ignored && i % 3 == 1) t[i] = ignore_index;
  }
  if (rows > 0) t[0] = vocab - 1;  // the last class (the tail of the row)
  return Array::from_vector(t, {rows});
}

std::vector<Array> cross_entropy_outputs(const Array& logits, const Array& targets, int64_t ignore_index) {
  const DType acc = ts::accumulation_dtype(logits.dtype());
  const int64_t rows = logits.shape(0);
  return make(std::make_shared<ts::CrossEntropy>(ignore_index), {{rows}, {rows}}, {acc, acc}, {logits, targets});
}

}  // namespace

TEST(CudaCrossEntropy, ForwardMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (int64_t vocab : kCols)
      for (int64_t ignore : {int64_t{-100}, int64_t{0}}) {
        const int64_t rows = vocab > 10000 ? 7 : 9;
        Array logits = random_array({rows, vocab}, dtype, 3.0f);
        Array targets = random_targets(rows, vocab, ignore, true);
        auto outs = cross_entropy_outputs(logits, targets, ignore);
        std::vector<Array> gpu =
            expect_matches_cpu(outs, "cross_entropy " + ts::type_string(logits) + " ignore=" + std::to_string(ignore));
        // Ignored rows: loss exactly 0.
        const std::vector<int64_t> t = targets.to_vector<int64_t>();
        const std::vector<float> loss = values(gpu[0]);
        for (size_t r = 0; r < t.size(); ++r) {
          if (t[r] == ignore) {
            EXPECT_EQ(loss[r], 0.0f) << r;
          }
        }
      }
}

TEST(CudaCrossEntropy, BackwardMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (int64_t vocab : kCols) {
      const int64_t rows = vocab > 10000 ? 7 : 9;
      const int64_t ignore = -100;
      Array logits = random_array({rows, vocab}, dtype, 3.0f);
      Array targets = random_targets(rows, vocab, ignore, true);
      auto fwd = cross_entropy_outputs(logits, targets, ignore);
      ts::eval(fwd);
      Array dloss = random_array({rows}, ts::accumulation_dtype(dtype), 1.0f, 0.5f);
      auto outs = make(std::make_shared<ts::CrossEntropyGrad>(ignore), {logits.shape()}, {dtype},
                       {logits, targets, fwd[1], dloss});
      std::vector<Array> gpu = expect_matches_cpu(outs, "cross_entropy_grad " + ts::type_string(logits));
      // Ignored rows are exactly zero.
      const std::vector<int64_t> t = targets.to_vector<int64_t>();
      const std::vector<float> d = values(gpu[0]);
      for (size_t r = 0; r < t.size(); ++r) {
        if (t[r] != ignore) continue;
        for (int64_t j = 0; j < vocab; ++j) ASSERT_EQ(d[r * vocab + j], 0.0f) << r << " " << j;
      }
    }
}

// A padded vocabulary (CrossEntropy classes < the row length, GPT-2's 50257 of 50304):
// the GPU matches the CPU, the padding never enters the loss and gets a zero gradient.
TEST(CudaCrossEntropy, PaddedVocabularyMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (auto [classes, stride] : {std::pair<int64_t, int64_t>{50257, 50304}, {1031, 1152}, {5, 8}}) {
      const int64_t rows = 7, ignore = -100;
      Array logits = random_array({rows, stride}, dtype, 3.0f);
      Array targets = random_targets(rows, classes, ignore, true);
      const DType acc = ts::accumulation_dtype(dtype);
      auto fwd =
          make(std::make_shared<ts::CrossEntropy>(ignore, classes), {{rows}, {rows}}, {acc, acc}, {logits, targets});
      const std::string what = ts::type_string(logits) + " classes=" + std::to_string(classes);
      std::vector<Array> gpu_fwd = expect_matches_cpu(fwd, "cross_entropy " + what);
      Array dloss = random_array({rows}, acc, 1.0f, 0.5f);
      auto grad = make(std::make_shared<ts::CrossEntropyGrad>(ignore, classes), {logits.shape()}, {dtype},
                       {logits, targets, gpu_fwd[1], dloss});
      std::vector<Array> gpu = expect_matches_cpu(grad, "cross_entropy_grad " + what);
      const std::vector<float> d = values(gpu[0]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = classes; j < stride; ++j) ASSERT_EQ(d[r * stride + j], 0.0f) << r << " " << j;
      // The padding's values do not matter: the loss of the rows' first `classes` alone.
      Array real = ts::slice_axis(logits, 1, 0, classes).eval();
      auto plain = make(std::make_shared<ts::CrossEntropy>(ignore), {{rows}, {rows}}, {acc, acc}, {real, targets});
      const std::vector<float> want = values(ts::cuda::run_on_gpu(plain[0])[0]), got = values(gpu_fwd[0]);
      for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(got[r], want[r], 1e-5 * (1 + std::fabs(want[r]))) << r;
    }
}

// The fused classifier (cross_entropy_with_grad, made by the classifier-fusion pass):
// loss, lse and dlogits as the CPU computes them, padded or not, ignored rows included.
TEST(CudaCrossEntropy, WithGradMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : kFloatTypes)
    for (auto [classes, stride] : {std::pair<int64_t, int64_t>{50257, 50304}, {1000, 1000}, {37, 48}, {5, 5}}) {
      const int64_t rows = 9, ignore = -100;
      Array logits = random_array({rows, stride}, dtype, 3.0f);
      Array targets = random_targets(rows, classes, ignore, true);
      const DType acc = ts::accumulation_dtype(dtype);
      Array dloss = random_array({rows}, acc, 1.0f, 0.5f);
      auto outs = make(std::make_shared<ts::CrossEntropyWithGrad>(ignore, classes == stride ? 0 : classes),
                       {{rows}, {rows}, {rows, stride}}, {acc, acc, dtype}, {logits, targets, dloss});
      std::vector<Array> gpu = expect_matches_cpu(
          outs, "cross_entropy_with_grad " + ts::type_string(logits) + " classes=" + std::to_string(classes));
      const std::vector<float> d = values(gpu[2]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = classes; j < stride; ++j) ASSERT_EQ(d[r * stride + j], 0.0f) << r << " " << j;
    }
}

TEST(CudaCrossEntropy, OutOfRangeTargetGivesNaN) {
  TESSERA_REQUIRE_GPU();
  // The CPU throws; the device cannot without a host synchronization: NaN loss and row.
  Array logits = random_array({3, 11}, DType::Float32);
  Array targets = Array::from_vector(std::vector<int64_t>{2, 11, -100}, {3});
  auto outs = cross_entropy_outputs(logits, targets, -100);
  std::vector<Array> gpu = ts::cuda::run_on_gpu(outs[0]);
  const std::vector<float> loss = values(gpu[0]);
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  EXPECT_EQ(loss[2], 0.0f);
  Array lse = Array::from_vector(values(gpu[1]), {3});
  Array dloss = Array::from_vector(std::vector<float>{1, 1, 1}, {3});
  auto g = make(std::make_shared<ts::CrossEntropyGrad>(-100), {logits.shape()}, {DType::Float32},
                {logits, targets, lse, dloss});
  const std::vector<float> d = values(ts::cuda::run_on_gpu(g[0])[0]);
  for (int j = 0; j < 11; ++j) {
    EXPECT_TRUE(std::isfinite(d[j]));
    EXPECT_TRUE(std::isnan(d[11 + j]));
    EXPECT_EQ(d[22 + j], 0.0f);
  }
}
