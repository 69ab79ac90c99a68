// Reductions on the GPU (backend/cuda/eval_reduce.cpp, kernels/reduce.cu) against the
// CPU backend: sum / prod / max / min over axis sets that take every path of the plan
// (rows by thread, warp, block and two-pass chunks; columns in one and two passes, by
// the column kernels for wide float rows (more in test_cuda_reduce_columns.cpp);
// the general strided kernel; nothing reduced; empty reductions), every dtype family,
// and argmax / argmin with ties and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/reduce.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/reduce.h"

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::ReduceKind;
using ts::Shape;

namespace {

uint64_t next_seed() {
  static uint64_t seed = 9000;
  return ++seed;
}

// Random values of `dtype`: for products near 1 (floats) or mostly 1 (integers), so
// they neither overflow nor vanish; integers in a small range (ties for max / argmax).
// With NaNs: about one float in `nan_every` is NaN and one in ten a whole number (ties).
Array random_input(const Shape& shape, DType dtype, bool for_prod, int nan_every = 0) {
  std::mt19937_64 rng(next_seed());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> ints(-20, 20), percent(0, 99), nan_draw(0, std::max(nan_every, 1) - 1);
  const bool with_nan = nan_every > 0;
  Array a = Array::empty(shape, dtype);
  for (int64_t i = 0; i < a.size(); ++i) {
    double v;
    if (ts::is_floating(dtype)) {
      v = for_prod ? 1.0 + 0.01 * normal(rng) : normal(rng);
      if (with_nan && nan_draw(rng) == 0) v = NAN;
      if (with_nan && percent(rng) < 10) v = std::round(v);  // ties
    } else if (dtype == DType::Bool) {
      v = percent(rng) < 50;
    } else if (for_prod) {
      v = percent(rng) < 90 ? 1 : (percent(rng) < 50 ? -1 : 2);
    } else {
      v = ints(rng) + (ts::is_signed(dtype) ? 0 : 20);
    }
    ts::store_from_double(dtype, a.mutable_raw_data(), i, v);
  }
  return a;
}

std::vector<double> as_doubles(const Array& a) {
  const void* data = a.raw_data();
  std::vector<double> out(static_cast<size_t>(a.size()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = ts::load_as_double(a.dtype(), data, static_cast<int64_t>(i));
  return out;
}

// Sums / products: ||gpu - cpu|| / ||cpu|| within the dtype's tolerance (the orders
// differ); max / min, integers and bools: equal (NaN where the CPU has NaN).
void expect_same(const Array& gpu, const Array& cpu, const std::string& what, bool exact, double tol_override = 0) {
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<double> g = as_doubles(gpu), c = as_doubles(cpu);
  double num = 0, den = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (exact || !ts::is_floating(cpu.dtype()) || !std::isfinite(c[i])) {
      if (!((std::isnan(g[i]) && std::isnan(c[i])) || g[i] == c[i])) {
        ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " on the GPU and " << c[i] << " on the CPU";
        return;
      }
      continue;
    }
    num += (g[i] - c[i]) * (g[i] - c[i]);
    den += c[i] * c[i];
  }
  const double tol = tol_override > 0                ? tol_override
                     : cpu.dtype() == DType::Float64 ? 1e-12
                     : cpu.dtype() == DType::Float32 ? ts::cuda_test::kF32Tolerance
                                                     : ts::cuda_test::kBf16Tolerance;
  EXPECT_LT(den > 0 ? std::sqrt(num / den) : std::sqrt(num), tol) << what;
}

Shape reduced_shape(const Shape& shape, const std::vector<int>& axes) {
  Shape out;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) out.push_back(shape[d]);
  return out;
}

const char* kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum:
      return "sum";
    case ReduceKind::Prod:
      return "prod";
    case ReduceKind::Max:
      return "max";
    case ReduceKind::Min:
      return "min";
  }
  return "?";
}

struct AxisCase {
  Shape shape;
  std::vector<int> axes;
};

// Each path of ReducePlan (see kernels/reduce.h).
const AxisCase kAxisCases[] = {
    {{1000, 5}, {1}},        // rows, a thread per row
    {{7, 1000}, {1}},        // rows, a warp per row
    {{5, 3001}, {1}},        // rows, a block per row
    {{3, 70001}, {1}},       // rows, two passes over chunks
    {{1000003}, {0}},        // everything, two passes
    {{7, 1000}, {0}},        // columns, two passes
    {{2048, 768}, {0}},      // a bias gradient (the column kernels for floats)
    {{20, 7}, {0}},          // columns, one pass
    {{4, 50, 6}, {1}},       // columns with an outer dim
    {{4, 5, 6, 7}, {0, 2}},  // general
    {{4, 5, 6, 7}, {1, 3}},  // general
    {{2, 3, 4, 5, 6}, {0, 2, 4}},
    {{4, 5, 6, 7}, {0, 1, 2, 3}},
    {{6, 1, 9}, {0, 2}},  // size-1 dims dropped: one row
    {{3, 1, 5}, {1}},     // nothing reduced
    {{5, 0}, {1}},        // empty: the identity
    {{0, 5}, {1}},        // no outputs
};

}  // namespace

TEST(CudaReduce, EveryKindOverEveryPath) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64, DType::Int32, DType::Int64,
                      DType::UInt8, DType::Bool})
    for (ReduceKind kind : {ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max, ReduceKind::Min})
      for (const AxisCase& c : kAxisCases) {
        if (ts::numel(c.shape) > 100000 && !(dtype == DType::Float32 || dtype == DType::BFloat16)) continue;
        const Shape out_shape = reduced_shape(c.shape, c.axes);
        int64_t reduced = 1;
        for (int a : c.axes) reduced *= c.shape[a];
        if (reduced == 0 && (kind == ReduceKind::Max || kind == ReduceKind::Min)) continue;  // an error (below)
        Array x = random_input(c.shape, dtype, kind == ReduceKind::Prod);
        Array y = Array::make(out_shape, dtype, std::make_shared<ts::Reduce>(kind, c.axes), {x});
        const std::string what = std::string(kind_name(kind)) + " " + ts::type_string(x) + " axes " +
                                 std::to_string(c.axes.size()) + " from " + std::to_string(c.axes[0]);
        std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
        ASSERT_EQ(gpu.size(), 1u);
        Array reference = y;
        double tol = 0;  // the dtype's
        if ((dtype == DType::Float32) && (kind == ReduceKind::Sum || kind == ReduceKind::Prod) && reduced > 100000) {
          // Long float32 sums and products are compared with the float64 result, rounded
          // once (the CPU's sequential order carries its own rounding). A float32 product
          // of n terms, in any order, makes n roundings of relative size up to u = 2^-24,
          // independent and uniform: its relative error has a standard deviation of
          // u sqrt(n / 3) (3.4e-5 for 10^6 terms; measured 3.2e-5 on an H100). Four of
          // those (1.4e-4) still catch one term lost or doubled (terms are 1 +- 1%).
          Array wide = Array::make(out_shape, DType::Float64, std::make_shared<ts::Reduce>(kind, c.axes),
                                   {ts::astype(x, DType::Float64)});
          reference = ts::astype(wide, dtype);
          reference.eval();
          if (kind == ReduceKind::Prod) tol = 4 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(reduced) / 3);
        }
        expect_same(gpu[0], reference, what, kind == ReduceKind::Max || kind == ReduceKind::Min, tol);
      }
}

TEST(CudaReduce, MaxAndMinPropagateNaN) {
  TESSERA_REQUIRE_GPU();
  // About one row in three has a NaN; rows long enough for the block path too.
  for (const AxisCase& c :
       {AxisCase{{64, 100}, {1}}, AxisCase{{9, 3001}, {1}}, AxisCase{{300, 17}, {0}}, AxisCase{{4, 5, 6, 7}, {0, 2}}})
    for (DType dtype : {DType::Float32, DType::BFloat16})
      for (ReduceKind kind : {ReduceKind::Max, ReduceKind::Min}) {
        const int reduced = static_cast<int>(ts::numel(c.shape) / ts::numel(reduced_shape(c.shape, c.axes)));
        Array x = random_input(c.shape, dtype, false, 3 * reduced);
        Array y = Array::make(reduced_shape(c.shape, c.axes), dtype, std::make_shared<ts::Reduce>(kind, c.axes), {x});
        expect_same(ts::cuda::run_on_gpu(y)[0], y, std::string(kind_name(kind)) + " NaN " + ts::type_string(x), true);
      }
}

TEST(CudaReduce, MaxOverAnEmptyAxisIsAnError) {
  TESSERA_REQUIRE_GPU();
  Array x = Array::empty({5, 0}, DType::Float32);
  Array y = Array::make({5}, DType::Float32, std::make_shared<ts::Reduce>(ReduceKind::Max, std::vector<int>{1}), {x});
  EXPECT_THROW(ts::cuda::run_on_gpu(y), ts::ValueError);
}

TEST(CudaReduce, SumIsDeterministic) {
  TESSERA_REQUIRE_GPU();
  Array x = random_input({3, 70001}, DType::Float32, false);
  Array y = Array::make({3}, DType::Float32, std::make_shared<ts::Reduce>(ReduceKind::Sum, std::vector<int>{1}), {x});
  const std::vector<double> a = as_doubles(ts::cuda::run_on_gpu(y)[0]), b = as_doubles(ts::cuda::run_on_gpu(y)[0]);
  EXPECT_EQ(a, b);
}

TEST(CudaReduce, ArgMaxArgMinWithTiesAndNaN) {
  TESSERA_REQUIRE_GPU();
  struct Case {
    Shape shape;
    int axis;
  };
  // a block per row (long rows), a thread per output (short rows, columns)
  const Case cases[] = {{{7, 100}, 1}, {{3, 50257}, 1}, {{7, 30}, 1}, {{5, 40, 3}, 1}, {{300, 4}, 0}, {{1, 1}, 0}};
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float64, DType::Int32, DType::UInt8, DType::Bool})
    for (bool is_max : {true, false})
      for (const Case& c : cases)
        for (int nan_every : {0, 3 * static_cast<int>(c.shape[c.axis])}) {  // some rows with a NaN
          Array x = random_input(c.shape, dtype, false, nan_every);
          Array y = is_max ? ts::argmax(x, c.axis) : ts::argmin(x, c.axis);
          std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
          expect_same(gpu[0], y, std::string(is_max ? "argmax " : "argmin ") + ts::type_string(x), true);
        }
}

TEST(CudaReducePlan, ChoosesThePathFromTheShape) {
  // Host-only: the plan depends on the shape alone.
  namespace cu = ts::cuda;
  cu::ReducePlan p;
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {2048, 768}, {0}, &p));
  EXPECT_EQ(p.kind, cu::reduce_path() == cu::ReducePath::Column ? cu::ReducePlan::Kind::ColumnStrips
                                                                : cu::ReducePlan::Kind::Columns);
  EXPECT_GT(p.chunks, 1);
  EXPECT_EQ(p.scratch_bytes, static_cast<size_t>(p.chunks * 768 * 4));
  ASSERT_TRUE(cu::plan_reduce(DType::BFloat16, {8, 1, 3, 5}, {2, 3}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Rows);
  EXPECT_EQ(p.outer, 8);
  EXPECT_EQ(p.len, 15);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {4, 5, 6, 7}, {0, 2}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::General);
  EXPECT_EQ(p.kept_rank, 2);
  EXPECT_EQ(p.reduced_rank, 2);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {3, 1, 5}, {1}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Copy);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {5, 0}, {1}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Fill);
}

TEST(CudaReducePlan, CutsFewLongRowsIntoAboutFiveHundredChunks) {
  // Host-only. A gradient norm sums the squares of a whole weight: one long row.
  namespace cu = ts::cuda;
  struct Restore {
    cu::ReducePath path = cu::reduce_path();
    ~Restore() { cu::set_reduce_path(path); }
  } restore;
  cu::set_reduce_path(cu::ReducePath::Column);
  cu::ReducePlan p;
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {768, 768}, {0, 1}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Rows);
  EXPECT_EQ(p.chunk_len, 2048);  // the smallest chunk: 8 elements per thread
  EXPECT_EQ(p.chunks, 288);
  EXPECT_EQ(p.scratch_bytes, 288u * 4);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {50257, 768}, {0, 1}, &p));
  EXPECT_EQ(p.chunks, 512);
  EXPECT_GE(p.chunks * p.chunk_len, 50257 * 768);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {3072}, {0}, &p));  // a bias: one block
  EXPECT_EQ(p.chunks, 1);
  cu::set_reduce_path(cu::ReducePath::Legacy);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {768, 768}, {0, 1}, &p));
  EXPECT_EQ(p.chunk_len, 16384);
  EXPECT_EQ(p.chunks, 36);
}
