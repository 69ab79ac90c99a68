// The column kernels of reductions over leading axes (backend/cuda/kernels/column_sum.h,
// ReducePlan::Kind::ColumnStrips): bias-gradient shapes of GPT-2 124M, rows that do not
// allow 16-byte loads (a width that is not a multiple of the vector, a misaligned
// pointer), tiny and odd shapes, every float dtype, determinism, and the legacy
// thread-per-column path behind TESSERA_CUDA_REDUCE=legacy. The kernels run on raw
// device buffers (plan_reduce + reduce) and are compared with a float64 reference of
// the same stored inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/kernels/reduce.h"
#include "cuda/cuda_test_util.h"
#include "tessera/base/shape.h"

namespace ts = tessera;
namespace cu = tessera::cuda;
using ts::DType;
using ts::ReduceKind;
using ts::cuda_test::DeviceBuffer;

namespace {

// x [shape] reduced over `axes` (one contiguous run of dims).
struct Case {
  std::vector<int64_t> shape;
  std::vector<int> axes;
};

// Unit roundoff of a dtype: half the distance from 1 to the next value.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::BFloat16:
      return std::ldexp(1.0, -8);
    case DType::Float16:
      return std::ldexp(1.0, -11);
    case DType::Float64:
      return std::ldexp(1.0, -53);
    default:
      return std::ldexp(1.0, -24);  // float32, and the accumulator of the halves
  }
}

// [outer, len, inner] of a case: the kept dims before the reduced run, the reduced run,
// the kept dims after it.
void split(const Case& c, int64_t* outer, int64_t* len, int64_t* inner) {
  *outer = *len = *inner = 1;
  for (int d = 0; d < static_cast<int>(c.shape.size()); ++d) {
    const bool reduced = std::find(c.axes.begin(), c.axes.end(), d) != c.axes.end();
    (reduced ? *len : (d < c.axes.front() ? *outer : *inner)) *= c.shape[d];
  }
}

struct Outcome {
  std::vector<double> out;  // the GPU's outputs, widened
  std::vector<double> ref;  // the float64 reference
  std::vector<double> tol;  // its bound per output
  cu::ReducePlan plan;
};

// Random inputs of variance 1 stored in `dtype` (seeded by `seed`) from `offset_elements`
// into a fresh allocation (1: not 16-byte aligned), reduced on the GPU with `op`; the
// reference and its error bound from the same stored values.
Outcome run_case(const Case& c, DType dtype, ReduceKind op, uint64_t seed, int offset_elements = 0) {
  Outcome r;
  EXPECT_TRUE(cu::plan_reduce(dtype, c.shape, c.axes, &r.plan));
  int64_t outer, len, inner;
  split(c, &outer, &len, &inner);
  const size_t item = ts::itemsize(dtype);
  const int64_t n = outer * len * inner;
  std::vector<unsigned char> host((static_cast<size_t>(n) + offset_elements) * item);
  // Uniform in [-sqrt(3), sqrt(3)) (mean 0, variance 1) from a splitmix64 stream: fast
  // enough for the 50M-element cases.
  uint64_t state = seed;
  auto next_value = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) * 0x1p-53 * 2 - 1) * std::sqrt(3.0);
  };
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ts::store_from_double(dtype, host.data(), i + offset_elements, next_value());
    x[i] = ts::load_as_double(dtype, host.data(), i + offset_elements);  // the stored value
  }
  DeviceBuffer<unsigned char> dx(host), dout(static_cast<size_t>(outer * inner) * item), scratch(r.plan.scratch_bytes);
  dout.poison();
  ts::cuda_test::check(
      cu::reduce(op, dtype, r.plan, dx.get() + offset_elements * item, dout.get(), scratch.get(), nullptr),
      "reduce launch");
  const std::vector<unsigned char> out = dout.download();
  // The bound. Rounding an addition s = a + b errs by at most u_acc |s| (u_acc the
  // accumulator's unit roundoff), with random signs, so a sum's error is a random walk
  // of about u_acc sqrt(sum over its additions of s^2). The inputs have mean 0: a
  // partial sum of k of them is about sqrt(k) sigma, so even one sequential chain of
  // len additions gives u_acc sqrt(len^2 / 2) sigma = u_acc sqrt(len / 2) ||x||_2
  // (||x||_2 = sqrt(len) sigma), and the kernels' blocked orders (chains of tens of
  // additions, then trees of partials) stay below it. The bound,
  // 4 sqrt(len) u_acc ||x||_2, leaves a factor of 5 or more over thousands of columns;
  // to it comes the output's rounding, u_out |reference|. For 16384 float32 rows it is
  // about 0.004, while a lost or doubled row errs by about 1. Max is exact.
  const double u_acc = unit_roundoff(dtype == DType::Float64 ? DType::Float64 : DType::Float32);
  const double u_out = unit_roundoff(dtype);
  r.out.resize(static_cast<size_t>(outer * inner));
  r.ref.assign(r.out.size(), op == ReduceKind::Sum ? 0.0 : -INFINITY);
  r.tol.assign(r.out.size(), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t col = 0; col < inner; ++col) {
      const size_t k = static_cast<size_t>(o * inner + col);
      double squares = 0;
      for (int64_t l = 0; l < len; ++l) {
        const double v = x[static_cast<size_t>((o * len + l) * inner + col)];
        r.ref[k] = op == ReduceKind::Sum ? r.ref[k] + v : std::max(r.ref[k], v);
        squares += v * v;
      }
      if (op == ReduceKind::Sum) {
        const double acc_bound = 4 * std::sqrt(static_cast<double>(len)) * u_acc * std::sqrt(squares);
        r.tol[k] = acc_bound + u_out * (std::fabs(r.ref[k]) + acc_bound);
      }
      r.out[k] = ts::load_as_double(dtype, out.data(), static_cast<int64_t>(k));
    }
  return r;
}

std::string describe(const Case& c, DType dtype) {
  std::string s = std::string(ts::name(dtype)) + "[";
  for (size_t i = 0; i < c.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(c.shape[i]);
  s += "] over axes";
  for (int a : c.axes) s += " " + std::to_string(a);
  return s;
}

void expect_within_bound(const Outcome& r, const std::string& what) {
  for (size_t k = 0; k < r.ref.size(); ++k)
    if (!(std::fabs(r.out[k] - r.ref[k]) <= r.tol[k])) {  // NaN (an unwritten output) fails too
      ADD_FAILURE() << what << ": output " << k << " is " << r.out[k] << ", the float64 reference " << r.ref[k]
                    << " (bound " << r.tol[k] << ")";
      return;
    }
}

// Shapes the column kernels take: GPT-2's bias gradients ([tokens, d] for d = 768,
// 2304, 3072), merged leading axes, widths that are not a multiple of 8 (scalar loads
// for 16-bit dtypes) or of 4 (for every dtype), odd row counts, one chunk and many, and
// an outer kept dim.
const Case kCases[] = {
    {{16384, 2304}, {0}},       // qkv bias
    {{16, 1024, 768}, {0, 1}},  // attention-out / fc2 bias, as the model writes it
    {{16384, 3072}, {0}},       // fc1 bias
    {{3, 5, 768}, {0, 1}},      // 15 rows: one chunk, no scratch
    {{1001, 100}, {0}},         // 100 columns: 16-byte loads for 4-byte dtypes only
    {{999, 770}, {0}},          // 770 columns: scalar loads for every dtype
    {{4097, 64}, {0}},          // the narrowest rows taken, a row count one past a power of 2
    {{4, 50, 768}, {1}},        // an outer kept dim
    {{1, 7, 80}, {1}},          // fewer rows than row lanes
};

}  // namespace

TEST(CudaReduceColumns, SumsMatchAFloat64Reference) {
  TESSERA_REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType dtype : {DType::BFloat16, DType::Float16, DType::Float32, DType::Float64})
    for (const Case& c : kCases) {
      // The 16-bit and 32-bit kernels of the other dtypes, on the smaller cases.
      if ((dtype == DType::Float16 || dtype == DType::Float64) && ts::numel(c.shape) > 20'000'000) continue;
      const Outcome r = run_case(c, dtype, ReduceKind::Sum, ++seed);
      EXPECT_EQ(r.plan.kind, cu::ReducePlan::Kind::ColumnStrips) << describe(c, dtype);
      expect_within_bound(r, "sum " + describe(c, dtype));
    }
}

TEST(CudaReduceColumns, MaxIsExact) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::BFloat16, DType::Float32})
    for (const Case& c : {Case{{16384, 768}, {0}}, Case{{999, 770}, {0}}, Case{{4, 50, 768}, {1}}})
      expect_within_bound(run_case(c, dtype, ReduceKind::Max, 7), "max " + describe(c, dtype));
}

TEST(CudaReduceColumns, MisalignedInputsTakeScalarLoadsWithTheSameBits) {
  TESSERA_REQUIRE_GPU();
  // The order of every sum depends on the shape only, so the scalar fallback (input one
  // element past a 16-byte boundary) gives the vectorized kernel's bits.
  for (DType dtype : {DType::BFloat16, DType::Float32})
    for (const Case& c : {Case{{16384, 768}, {0}}, Case{{3, 5, 768}, {0, 1}}, Case{{4, 50, 768}, {1}}}) {
      const Outcome aligned = run_case(c, dtype, ReduceKind::Sum, 42);
      const Outcome shifted = run_case(c, dtype, ReduceKind::Sum, 42, 1);
      expect_within_bound(shifted, "misaligned sum " + describe(c, dtype));
      EXPECT_EQ(aligned.out, shifted.out) << describe(c, dtype);
    }
}

TEST(CudaReduceColumns, IsBitwiseTheSameOnEveryRun) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::BFloat16, DType::Float32}) {
    const Case c{{16384, 2304}, {0}};  // the qkv bias gradient
    const Outcome a = run_case(c, dtype, ReduceKind::Sum, 5), b = run_case(c, dtype, ReduceKind::Sum, 5);
    EXPECT_EQ(a.out, b.out) << describe(c, dtype);
  }
}

TEST(CudaReduceColumns, LegacyPathGivesTheSameSums) {
  TESSERA_REQUIRE_GPU();
  struct Restore {
    cu::ReducePath path = cu::reduce_path();
    ~Restore() { cu::set_reduce_path(path); }
  } restore;
  for (DType dtype : {DType::BFloat16, DType::Float32})
    for (const Case& c : {Case{{16384, 768}, {0}}, Case{{999, 770}, {0}}, Case{{3, 5, 768}, {0, 1}}}) {
      cu::set_reduce_path(cu::ReducePath::Column);
      const Outcome column = run_case(c, dtype, ReduceKind::Sum, 11);
      cu::set_reduce_path(cu::ReducePath::Legacy);
      const Outcome legacy = run_case(c, dtype, ReduceKind::Sum, 11);
      EXPECT_EQ(column.plan.kind, cu::ReducePlan::Kind::ColumnStrips);
      EXPECT_EQ(legacy.plan.kind, cu::ReducePlan::Kind::Columns);
      expect_within_bound(legacy, "legacy sum " + describe(c, dtype));
      // Both within the bound of the same reference: within twice it of each other.
      for (size_t k = 0; k < column.out.size(); ++k)
        if (!(std::fabs(column.out[k] - legacy.out[k]) <= 2 * column.tol[k])) {
          ADD_FAILURE() << describe(c, dtype) << ": output " << k << " is " << column.out[k] << " (column) and "
                        << legacy.out[k] << " (legacy)";
          break;
        }
    }
}

TEST(CudaReduceColumnsPlan, ChoosesTheColumnKernelsForWideFloatRows) {
  // Host-only: the plan depends on the shape and the path flag.
  struct Restore {
    cu::ReducePath path = cu::reduce_path();
    ~Restore() { cu::set_reduce_path(path); }
  } restore;
  cu::set_reduce_path(cu::ReducePath::Column);
  cu::ReducePlan p;
  ASSERT_TRUE(cu::plan_reduce(DType::BFloat16, {16, 1024, 2304}, {0, 1}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::ColumnStrips);
  EXPECT_EQ(p.len, 16384);
  EXPECT_EQ(p.inner, 2304);
  EXPECT_EQ(p.chunk_len % 8, 0);
  EXPECT_GE(p.chunk_len, 64);
  EXPECT_GE(p.chunks * p.chunk_len, p.len);
  EXPECT_LT((p.chunks - 1) * p.chunk_len, p.len);
  // About 1024 blocks: 9 strips of 256 bf16 columns times the chunks.
  EXPECT_GE(9 * p.chunks, 1024);
  EXPECT_LT(9 * p.chunks, 1100);
  EXPECT_EQ(p.scratch_bytes, static_cast<size_t>(p.chunks * 2304 * 4));
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {3, 5, 768}, {0, 1}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::ColumnStrips);
  EXPECT_EQ(p.chunks, 1);
  EXPECT_EQ(p.scratch_bytes, 0u);
  ASSERT_TRUE(cu::plan_reduce(DType::Float32, {2048, 63}, {0}, &p));  // narrow rows
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Columns);
  ASSERT_TRUE(cu::plan_reduce(DType::Int32, {2048, 768}, {0}, &p));  // integers
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Columns);
  cu::set_reduce_path(cu::ReducePath::Legacy);
  ASSERT_TRUE(cu::plan_reduce(DType::BFloat16, {16384, 2304}, {0}, &p));
  EXPECT_EQ(p.kind, cu::ReducePlan::Kind::Columns);
}
