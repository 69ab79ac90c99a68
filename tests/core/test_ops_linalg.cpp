// matmul (2-D, batched, broadcast batch, 1-D operands, odd sizes, dtypes) and
// dot_general vs a naive float64 einsum.
#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

// Naive dot_general in float64. Result dims: batch (a_batch order), a free, b free.
std::pair<std::vector<double>, Shape> ref_dot_general(const std::vector<double>& a, const Shape& sa,
                                                      const std::vector<double>& b, const Shape& sb,
                                                      const std::vector<int>& ac, const std::vector<int>& bc,
                                                      const std::vector<int>& ab, const std::vector<int>& bb,
                                                      bool absolute = false) {
  auto is_in = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  std::vector<int> af, bf;
  for (int i = 0; i < static_cast<int>(sa.size()); ++i)
    if (!is_in(ac, i) && !is_in(ab, i)) af.push_back(i);
  for (int i = 0; i < static_cast<int>(sb.size()); ++i)
    if (!is_in(bc, i) && !is_in(bb, i)) bf.push_back(i);
  Shape so, sc;
  for (int d : ab) so.push_back(sa[d]);
  for (int d : af) so.push_back(sa[d]);
  for (int d : bf) so.push_back(sb[d]);
  for (int d : ac) sc.push_back(sa[d]);
  std::vector<double> out(static_cast<size_t>(numel(so)), 0.0);
  for (int64_t o = 0; o < numel(so); ++o) {
    auto oi = unravel(o, so);
    std::vector<int64_t> ai(sa.size()), bi(sb.size());
    size_t p = 0;
    for (size_t k = 0; k < ab.size(); ++k, ++p) ai[ab[k]] = bi[bb[k]] = oi[p];
    for (int d : af) ai[d] = oi[p++];
    for (int d : bf) bi[d] = oi[p++];
    double acc = 0;
    for (int64_t c = 0; c < numel(sc); ++c) {
      auto ci = unravel(c, sc);
      for (size_t k = 0; k < ac.size(); ++k) ai[ac[k]] = bi[bc[k]] = ci[k];
      double t = a[ravel(ai, sa)] * b[ravel(bi, sb)];
      acc += absolute ? std::abs(t) : t;
    }
    out[o] = acc;
  }
  return {out, so};
}

// Matmul reference through dot_general on explicitly broadcast operands.
// Returns (values, sum of |products| per element, shape).
struct MatmulRef {
  std::vector<double> value, magnitude;
  Shape shape;
};

MatmulRef ref_matmul_np(const std::vector<double>& a, Shape sa, const std::vector<double>& b, Shape sb) {
  bool a1 = sa.size() == 1, b1 = sb.size() == 1;
  if (a1) sa.insert(sa.begin(), 1);
  if (b1) sb.push_back(1);
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = ref_broadcast_shape(ba, bb);
  int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back(), B = numel(batch);
  std::vector<double> A(static_cast<size_t>(B * M * K)), Bm(static_cast<size_t>(B * K * N));
  Shape sa_full = batch, sb_full = batch;
  sa_full.push_back(M), sa_full.push_back(K), sb_full.push_back(K), sb_full.push_back(N);
  for (int64_t i = 0; i < numel(sa_full); ++i) A[i] = a[broadcast_index(unravel(i, sa_full), sa, sa_full)];
  for (int64_t i = 0; i < numel(sb_full); ++i) Bm[i] = b[broadcast_index(unravel(i, sb_full), sb, sb_full)];
  MatmulRef r;
  r.value = ref_matmul(A, Bm, B, M, K, N);
  auto absA = ref_unary(A, [](double x) { return std::abs(x); });
  auto absB = ref_unary(Bm, [](double x) { return std::abs(x); });
  r.magnitude = ref_matmul(absA, absB, B, M, K, N);
  r.shape = batch;
  if (!a1) r.shape.push_back(M);
  if (!b1) r.shape.push_back(N);
  return r;
}

// |got - ref| <= rtol * magnitude + atol, elementwise (magnitude = sum |a_ik b_kj|).
::testing::AssertionResult close_to_mag(const Array& got, const MatmulRef& r, double rtol, double atol) {
  if (got.shape() != r.shape)
    return ::testing::AssertionFailure() << "shape " << to_string(got.shape()) << ", expected " << to_string(r.shape);
  auto g = got.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - r.value[i]) <= rtol * r.magnitude[i] + atol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g[i] << ", expected " << r.value[i];
  return ::testing::AssertionSuccess();
}

TEST(Matmul, ShapesAndDtypes) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{1, 1}, {1, 1}},
      {{7, 33}, {33, 5}},
      {{33, 7}, {7, 33}},
      {{2, 3, 7, 4}, {2, 3, 4, 9}},
      {{4, 1, 5, 3}, {3, 3, 2}},
      {{5, 3}, {2, 3, 7}},
      {{33}, {33, 7}},
      {{7, 33}, {33}},
      {{7}, {7}},
      {{3, 1, 4}, {1, 4, 2}},
      {{0, 3}, {3, 4}},
      {{4, 0}, {0, 5}},
      {{64, 65}, {65, 66}},
  };
  uint32_t seed = 1;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16}) {
    for (const auto& [sa, sb] : cases) {
      auto va = round_to(random_values(numel(sa), seed++), dt);
      auto vb = round_to(random_values(numel(sb), seed++), dt);
      Array y = matmul(make_array(va, sa, dt), make_array(vb, sb, dt));
      EXPECT_EQ(y.dtype(), dt);
      auto r = ref_matmul_np(va, sa, vb, sb);
      double rtol = dt == DType::Float64 ? 1e-13 : dt == DType::Float32 ? 1e-5 : dt == DType::Float16 ? 4e-3 : 2e-2;
      EXPECT_TRUE(close_to_mag(y, r, rtol, 1e-300)) << name(dt) << " " << to_string(sa) << " @ " << to_string(sb);
    }
  }
  // Mixed dtypes promote: f32 @ f64 -> f64.
  Array m = matmul(random_array({2, 3}, 1, DType::Float32), random_array({3, 2}, 2));
  EXPECT_EQ(m.dtype(), DType::Float64);
}

TEST(Matmul, LargeFloat32AndThreadDeterminism) {
  const int64_t M = small_tests() ? 65 : 257, K = small_tests() ? 70 : 301, N = small_tests() ? 33 : 129;
  auto va = round_to(random_values(M * K, 3), DType::Float32), vb = round_to(random_values(K * N, 4), DType::Float32);
  Array a = make_array(va, {M, K}, DType::Float32), b = make_array(vb, {K, N}, DType::Float32);
  EXPECT_TRUE(close_to_mag(matmul(a, b), ref_matmul_np(va, {M, K}, vb, {K, N}), 1e-5, 0));
  int saved = num_threads();
  set_num_threads(1);
  auto r1 = matmul(a, b).to_vector<float>();
  set_num_threads(2);
  auto r2 = matmul(a, b).to_vector<float>();
  set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)));
}

struct DotCase {
  Shape sa, sb;
  std::vector<int> ac, bc, ab, bb;
};

TEST(DotGeneral, VsNaiveEinsum) {
  const std::vector<DotCase> cases = {
      {{3, 4}, {4, 5}, {1}, {0}, {}, {}},                      // ij,jk->ik
      {{2, 3, 4}, {2, 4, 5}, {2}, {1}, {0}, {0}},              // bij,bjk->bik
      {{4, 2, 3}, {5, 4, 2}, {0, 1}, {1, 2}, {}, {}},          // two contracting dims
      {{3, 2, 4}, {4, 2, 5}, {2}, {0}, {1}, {1}},              // batch dim not leading
      {{7, 3}, {7, 2}, {0}, {0}, {}, {}},                      // a^T b
      {{3}, {4}, {}, {}, {}, {}},                              // outer product
      {{2, 5, 3, 6}, {6, 3, 2, 1}, {3}, {0}, {0, 2}, {2, 1}},  // two batch dims, reordered in b
      {{33, 7}, {7, 33}, {1}, {0}, {}, {}},
  };
  uint32_t seed = 50;
  for (DType dt : {DType::Float64, DType::Float32}) {
    for (const auto& c : cases) {
      auto va = round_to(random_values(numel(c.sa), seed++), dt), vb = round_to(random_values(numel(c.sb), seed++), dt);
      Array y = dot_general(make_array(va, c.sa, dt), make_array(vb, c.sb, dt), c.ac, c.bc, c.ab, c.bb);
      auto [e, es] = ref_dot_general(va, c.sa, vb, c.sb, c.ac, c.bc, c.ab, c.bb);
      auto mag = ref_dot_general(va, c.sa, vb, c.sb, c.ac, c.bc, c.ab, c.bb, true).first;
      EXPECT_EQ(y.shape(), es) << to_string(c.sa) << " x " << to_string(c.sb);
      EXPECT_EQ(y.dtype(), dt);
      auto g = values(y);
      ASSERT_EQ(g.size(), e.size());
      double rtol = dt == DType::Float64 ? 1e-13 : 1e-5;
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_LE(std::abs(g[i] - e[i]), rtol * mag[i] + 1e-300)
            << name(dt) << " " << to_string(c.sa) << " x " << to_string(c.sb) << " element " << i;
    }
  }
}

}  // namespace
}  // namespace tessera::test
