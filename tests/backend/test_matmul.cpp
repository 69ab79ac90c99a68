// Batched matmul vs a naive float64 (or exact int64) reference: every dtype, both
// transposes, broadcast batch strides, zero-size dims, and both threading paths
// and shapes that split into several C tiles.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/kernels/matmul.h"
#include "nn_test_util.h"
#include "tessera/base/error.h"

namespace tessera::cpu {
namespace {

using namespace testing;

struct Case {
  int64_t batch, m, n, k;
  bool ta, tb;
  bool broadcast_a, broadcast_b;
};

int64_t a_size(const Case& c) { return (c.broadcast_a ? 1 : c.batch) * c.m * c.k; }
int64_t b_size(const Case& c) { return (c.broadcast_b ? 1 : c.batch) * c.k * c.n; }

MatmulShape shape_of(const Case& c) {
  MatmulShape s;
  s.batch = c.batch, s.m = c.m, s.n = c.n, s.k = c.k, s.trans_a = c.ta, s.trans_b = c.tb;
  s.a_batch_stride = c.broadcast_a ? 0 : c.m * c.k;
  s.b_batch_stride = c.broadcast_b ? 0 : c.k * c.n;
  return s;
}

// C and sum_p |a b| (the scale of the rounding error) in float64.
void reference(const Case& c, const std::vector<double>& a, const std::vector<double>& b, std::vector<double>& out,
               std::vector<double>& scale) {
  const MatmulShape s = shape_of(c);
  out.assign(static_cast<size_t>(c.batch * c.m * c.n), 0.0);
  scale = out;
  for (int64_t bi = 0; bi < c.batch; ++bi) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double av = a[bi * s.a_batch_stride + (c.ta ? p * c.m + i : i * c.k + p)];
          const double bv = b[bi * s.b_batch_stride + (c.tb ? j * c.k + p : p * c.n + j)];
          acc += av * bv;
          mag += std::abs(av * bv);
        }
        out[(bi * c.m + i) * c.n + j] = acc;
        scale[(bi * c.m + i) * c.n + j] = mag;
      }
    }
  }
}

const Case kCases[] = {
    {1, 1, 1, 1, false, false, false, false},    {1, 7, 33, 5, false, false, false, false},
    {1, 7, 33, 5, true, false, false, false},    {1, 7, 33, 5, false, true, false, false},
    {1, 7, 33, 5, true, true, false, false},     {3, 17, 9, 1000, false, true, false, false},
    {5, 8, 12, 16, false, false, true, false},   {5, 8, 12, 16, true, true, false, true},
    {2, 300, 37, 20, true, false, false, false},  // several row tiles
    {1, 3, 1100, 4, false, true, false, true},    // several column tiles
    {4, 3, 4, 0, false, false, false, false},    {2, 0, 4, 3, false, false, false, false},
    {0, 3, 4, 5, false, false, false, false},
};

TEST(Matmul, FloatDtypesMatchReference) {
  for (DType dt : kFloatTypes) {
    for (const Case& c : kCases) {
      auto a = rounded(dt, uniform(static_cast<size_t>(a_size(c)), -1, 1, 501));
      auto b = rounded(dt, uniform(static_cast<size_t>(b_size(c)), -1, 1, 502));
      Buf ab(dt, a), bb(dt, b), cb(dt, c.batch * c.m * c.n);
      for (int64_t i = 0; i < cb.size(); ++i) cb.set(i, 12345.0);  // must be overwritten
      matmul(dt, shape_of(c), ab.data(), bb.data(), cb.data());
      std::vector<double> want, scale;
      reference(c, a, b, want, scale);
      const double out_rel = dt == DType::BFloat16 ? 1.0 / 256 : dt == DType::Float16 ? 1.0 / 2048 : 0.0;
      const double sum_rel = dt == DType::Float64 ? 1e-14 : 1e-6;
      for (int64_t i = 0; i < cb.size(); ++i) {
        const double tol = out_rel * std::abs(want[i]) + sum_rel * (scale[i] + 1.0);
        ASSERT_NEAR(cb.get(i), want[i], tol) << name(dt) << " case b=" << c.batch << " m=" << c.m << " n=" << c.n
                                             << " k=" << c.k << " ta=" << c.ta << " tb=" << c.tb << " at " << i;
      }
    }
  }
}

TEST(Matmul, IntegerDtypesAreExact) {
  for (DType dt : {DType::Int64, DType::Int32, DType::Int8, DType::UInt8, DType::UInt32, DType::Bool}) {
    for (const Case& c : kCases) {
      const double lo = dt == DType::Bool ? 0 : (is_signed(dt) ? -9 : 0);
      auto draw = [&](int64_t n, uint32_t seed) {
        auto v = uniform(static_cast<size_t>(n), lo, 9.99, seed);
        for (auto& e : v) e = dt == DType::Bool ? (e > 5 ? 1.0 : 0.0) : std::trunc(e);
        return v;
      };
      auto a = draw(a_size(c), 511), b = draw(b_size(c), 512);
      Buf ab(dt, a), bb(dt, b), cb(dt, c.batch * c.m * c.n);
      matmul(dt, shape_of(c), ab.data(), bb.data(), cb.data());
      std::vector<double> want, scale;
      reference(c, a, b, want, scale);
      for (int64_t i = 0; i < cb.size(); ++i) {
        // Exact sums, wrapped into the element type (bool: any nonzero product).
        const int64_t w = static_cast<int64_t>(want[i]);
        double expect = static_cast<double>(w);
        if (dt == DType::Bool) expect = w != 0;
        if (dt == DType::Int8) expect = static_cast<int8_t>(w);
        if (dt == DType::UInt8) expect = static_cast<uint8_t>(w);
        ASSERT_EQ(cb.get(i), expect) << name(dt) << " k=" << c.k << " at " << i;
      }
    }
  }
}

TEST(Matmul, BitwiseIdenticalAcrossThreadCounts) {
  // Many small GEMMs, and GEMMs split into several tiles (the last one into row and
  // column tiles, transposed operands).
  const Case cases[] = {{24, 64, 48, 32, false, true, false, false},
                        {1, 300, 290, 310, false, false, false, false},
                        {1, 1100, 1300, 96, true, true, false, false}};
  for (const Case& c : cases) {
    for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
      Buf a(dt, uniform(static_cast<size_t>(a_size(c)), -1, 1, 521)),
          b(dt, uniform(static_cast<size_t>(b_size(c)), -1, 1, 522));
      Buf c1(dt, c.batch * c.m * c.n), c2(dt, c.batch * c.m * c.n), c3(dt, c.batch * c.m * c.n);
      with_threads(1, [&] { matmul(dt, shape_of(c), a.data(), b.data(), c1.data()); });
      with_threads(2, [&] { matmul(dt, shape_of(c), a.data(), b.data(), c2.data()); });
      with_threads(2, [&] { matmul(dt, shape_of(c), a.data(), b.data(), c3.data()); });
      EXPECT_TRUE(c1.bitwise_equal(c2)) << name(dt) << " m=" << c.m;
      EXPECT_TRUE(c2.bitwise_equal(c3)) << name(dt) << " m=" << c.m;
    }
  }
}

TEST(Matmul, RawSgemmMatchesMatmul) {
  const int64_t m = 33, n = 17, k = 65;
  Buf a(DType::Float32, uniform(m * k, -1, 1, 531)), b(DType::Float32, uniform(k * n, -1, 1, 532));
  Buf c1(DType::Float32, m * n), c2(DType::Float32, m * n);
  blas_sgemm(m, n, k, static_cast<const float*>(a.data()), static_cast<const float*>(b.data()), false,
             static_cast<float*>(c1.data()));
  MatmulShape s;
  s.m = m, s.n = n, s.k = k;
  matmul(DType::Float32, s, a.data(), b.data(), c2.data());
  EXPECT_TRUE(c1.bitwise_equal(c2));
}

TEST(Matmul, RejectsBadShapes) {
  Buf a(DType::Float32, 4);
  MatmulShape s;
  s.m = -1, s.n = 2, s.k = 2;
  EXPECT_THROW(matmul(DType::Float32, s, a.data(), a.data(), a.data()), ValueError);
  s.m = 2, s.b_batch_stride = -4;
  EXPECT_THROW(matmul(DType::Float32, s, a.data(), a.data(), a.data()), ValueError);
}

}  // namespace
}  // namespace tessera::cpu
