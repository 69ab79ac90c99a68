// Counter-based random numbers: reproducible across calls and thread counts,
// different for different keys, split keys independent, right shapes, dtypes,
// ranges and moments.
#include <cmath>
#include <cstring>

#include "test_util.h"

namespace tessera::test {
namespace {

int64_t big_n() { return small_tests() ? 20000 : 400000; }

template <typename T>
bool bitwise_equal(const Array& a, const Array& b) {
  auto va = a.to_vector<T>(), vb = b.to_vector<T>();
  return va.size() == vb.size() && std::memcmp(va.data(), vb.data(), va.size() * sizeof(T)) == 0;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(Random, KeysAndSplit) {
  Array k = key(42);
  EXPECT_EQ(k.dtype(), DType::UInt32);
  EXPECT_SHAPE(k, 2);
  EXPECT_TRUE(bitwise_equal<uint32_t>(k, key(42)));
  EXPECT_FALSE(bitwise_equal<uint32_t>(key(1), key(2)));
  // Seeds differing only in the high 32 bits give different keys.
  EXPECT_FALSE(bitwise_equal<uint32_t>(key(1), key(1 + (uint64_t{1} << 32))));

  Array s = random::split(k, 3);
  EXPECT_EQ(s.dtype(), DType::UInt32);
  EXPECT_SHAPE(s, 3, 2);
  EXPECT_TRUE(bitwise_equal<uint32_t>(s, random::split(k, 3)));
  auto sv = s.to_vector<uint32_t>();
  auto kv = k.to_vector<uint32_t>();
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(sv[2 * i] == kv[0] && sv[2 * i + 1] == kv[1]) << "split key " << i << " equals the parent";
    for (int j = 0; j < i; ++j) EXPECT_FALSE(sv[2 * i] == sv[2 * j] && sv[2 * i + 1] == sv[2 * j + 1]) << i << j;
  }
  auto ks = random::split_keys(k, 3);
  ASSERT_EQ(ks.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_SHAPE(ks[i], 2);
    EXPECT_EQ(ks[i].dtype(), DType::UInt32);
    auto v = ks[i].to_vector<uint32_t>();
    EXPECT_EQ(v[0], sv[2 * i]);
    EXPECT_EQ(v[1], sv[2 * i + 1]);
  }
  // A slice of split() works as a key.
  Array k0 = reshape(slice_axis(s, 0, 0, 1), {2});
  EXPECT_TRUE(bitwise_equal<float>(random::uniform(k0, {10}), random::uniform(ks[0], {10})));
}

TEST(Random, ReproducibleAcrossCallsAndThreadCounts) {
  const int64_t n = big_n();
  Array k = key(7);
  auto draw = [&] {
    std::vector<Array> r = {random::uniform(k, {n}), random::normal(k, {n / 10, 10}, DType::Float64),
                            random::bernoulli(k, 0.3, {n}), random::uniform(k, {1037}, DType::BFloat16, -2, 3),
                            random::split(k, 1001)};
    eval(r);
    return r;
  };
  int saved = num_threads();
  set_num_threads(1);
  auto a = draw();
  set_num_threads(2);
  auto b = draw();
  auto c = draw();
  set_num_threads(saved);
  for (const auto* other : {&b, &c}) {
    EXPECT_TRUE(bitwise_equal<float>(a[0], (*other)[0])) << "uniform";
    EXPECT_TRUE(bitwise_equal<double>(a[1], (*other)[1])) << "normal";
    EXPECT_TRUE(bitwise_equal<uint8_t>(astype(a[2], DType::UInt8), astype((*other)[2], DType::UInt8))) << "bernoulli";
    EXPECT_TRUE(bitwise_equal<float>(a[3], (*other)[3])) << "uniform bf16";
    EXPECT_TRUE(bitwise_equal<uint32_t>(a[4], (*other)[4])) << "split";
  }
}

TEST(Random, DifferentKeysDiffer) {
  auto ks = random::split_keys(key(3), 2);
  auto u0 = values(random::uniform(ks[0], {1000})), u1 = values(random::uniform(ks[1], {1000}));
  auto up = values(random::uniform(key(3), {1000}));
  int same01 = 0, same0p = 0;
  for (size_t i = 0; i < u0.size(); ++i) same01 += u0[i] == u1[i], same0p += u0[i] == up[i];
  EXPECT_LT(same01, 5);
  EXPECT_LT(same0p, 5);
  // Independence of split streams: correlation near 0 (|r| < 5 / sqrt(n)).
  double m0 = mean_of(u0), m1 = mean_of(u1), cov = 0;
  for (size_t i = 0; i < u0.size(); ++i) cov += (u0[i] - m0) * (u1[i] - m1);
  double r = cov / static_cast<double>(u0.size()) / (std_of(u0) * std_of(u1));
  EXPECT_LT(std::abs(r), 5 / std::sqrt(1000.0));
  // Neighbouring elements of one stream are uncorrelated too.
  double lag = 0;
  for (size_t i = 0; i + 1 < u0.size(); ++i) lag += (u0[i] - m0) * (u0[i + 1] - m0);
  EXPECT_LT(std::abs(lag / 999.0 / (std_of(u0) * std_of(u0))), 5 / std::sqrt(1000.0));
}

TEST(Random, UniformRangeAndDistribution) {
  const int64_t n = big_n();
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    Array u = random::uniform(key(11), {n / 4, 4}, dt, -2, 3);
    EXPECT_EQ(u.dtype(), dt);
    EXPECT_SHAPE(u, n / 4, 4);
    auto v = values(u);
    double lo = 1e300, hi = -1e300;
    for (double x : v) lo = std::min(lo, x), hi = std::max(hi, x);
    EXPECT_GE(lo, -2) << name(dt);
    if (dt == DType::Float32 || dt == DType::Float64)
      EXPECT_LT(hi, 3) << name(dt);
    else
      EXPECT_LE(hi, 3) << name(dt);
    EXPECT_NEAR(mean_of(v), 0.5, 5 * 5 / std::sqrt(12.0 * static_cast<double>(n))) << name(dt);
    // Ten equal bins, each within 5 sigma of n/10.
    std::vector<int64_t> bins(10, 0);
    for (double x : v) bins[std::min<int64_t>(9, static_cast<int64_t>((x + 2) / 5 * 10))]++;
    double expect = static_cast<double>(n) / 10, sigma = std::sqrt(static_cast<double>(n) * 0.1 * 0.9);
    // bf16 / f16 rounding moves mass between bins: a looser bound for them.
    double k = (dt == DType::BFloat16 || dt == DType::Float16) ? 0.05 * expect : 5 * sigma;
    for (int b = 0; b < 10; ++b) EXPECT_NEAR(static_cast<double>(bins[b]), expect, k) << name(dt) << " bin " << b;
  }
  EXPECT_SHAPE(random::uniform(key(1), {}), );
  EXPECT_EQ(random::uniform(key(1), {0, 3}).size(), 0);
}

TEST(Random, NormalMoments) {
  const int64_t n = big_n();
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    auto v = values(random::normal(key(13), {n}, dt, 1.5, 2.0));
    double tol = 5 * 2.0 / std::sqrt(static_cast<double>(n));
    EXPECT_NEAR(mean_of(v), 1.5, tol) << name(dt);
    EXPECT_NEAR(std_of(v), 2.0, 2 * tol + (dt == DType::BFloat16 ? 0.01 : 0)) << name(dt);
    // Tails: P(|z| > 2) ~ 4.55%.
    int64_t tails = 0;
    for (double x : v) tails += std::abs((x - 1.5) / 2.0) > 2;
    EXPECT_NEAR(static_cast<double>(tails) / static_cast<double>(n), 0.0455, 0.01) << name(dt);
  }
  auto z = values(random::normal(key(14), {n}));
  for (double x : z) ASSERT_TRUE(std::isfinite(x));
}

TEST(Random, Bernoulli) {
  const int64_t n = big_n();
  Array b = random::bernoulli(key(17), 0.3, {n});
  EXPECT_EQ(b.dtype(), DType::Bool);
  EXPECT_SHAPE(b, n);
  double frac = mean_of(values(b));
  EXPECT_NEAR(frac, 0.3, 5 * std::sqrt(0.3 * 0.7 / static_cast<double>(n)));
  // p broadcast to shape: rows with p = 0, 0.5, 1.
  Array p = make_array({0, 0.5, 1}, {3, 1}, DType::Float32);
  auto v = values(random::bernoulli(key(18), p, {3, 1000}));
  double r0 = 0, r1 = 0, r2 = 0;
  for (int j = 0; j < 1000; ++j) r0 += v[j], r1 += v[1000 + j], r2 += v[2000 + j];
  EXPECT_EQ(r0, 0);
  EXPECT_EQ(r2, 1000);
  EXPECT_NEAR(r1 / 1000, 0.5, 5 * std::sqrt(0.25 / 1000));
  EXPECT_EQ(mean_of(values(random::bernoulli(key(19), 0.0, {100}))), 0);
  EXPECT_EQ(mean_of(values(random::bernoulli(key(19), 1.0, {100}))), 1);
}

}  // namespace
}  // namespace tessera::test
