// Philox random streams: known answers, reproducibility (threads, chunking, repeated
// calls), key splitting, and distribution checks at 5 sigma.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "backend/cpu/kernels/random.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

std::array<uint32_t, 4> philox(std::array<uint32_t, 4> ctr, PhiloxKey key) {
  std::array<uint32_t, 4> out{};
  philox4x32_10(ctr.data(), key, out.data());
  return out;
}

// Runs fn with 1 and then 2 threads, restoring the previous count.
template <typename Fn>
void with_threads(int n, Fn fn) {
  const int before = num_threads();
  set_num_threads(n);
  fn();
  set_num_threads(before);
}

struct Moments {
  double mean = 0, var = 0, kurtosis = 0, min = INFINITY, max = -INFINITY;
};
template <typename T>
Moments moments(const std::vector<T>& x, double (*as_double)(T)) {
  Moments m;
  const double n = static_cast<double>(x.size());
  for (const T& v : x) {
    const double d = as_double(v);
    m.mean += d;
    m.min = std::min(m.min, d);
    m.max = std::max(m.max, d);
  }
  m.mean /= n;
  double m2 = 0, m4 = 0;
  for (const T& v : x) {
    const double d = as_double(v) - m.mean;
    m2 += d * d;
    m4 += d * d * d * d;
  }
  m.var = m2 / n;
  m.kurtosis = (m4 / n) / (m.var * m.var);
  return m;
}
double f32d(float v) { return v; }
double f64d(double v) { return v; }
double bf16d(bfloat16 v) { return bf16_to_float(v); }
double f16d(float16 v) { return f16_to_float(v); }

TEST(Random, PhiloxKnownAnswers) {
  // Random123 kat_vectors for philox4x32_10.
  EXPECT_EQ(philox({0, 0, 0, 0}, {0, 0}), (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  // The bits stream starts with the block at counter 0.
  uint32_t bits[4];
  random_bits({0, 0}, bits, 4);
  EXPECT_EQ(bits[0], 0x6627e8d5u);
  EXPECT_EQ(bits[3], 0x9b00dbd8u);
}

TEST(Random, BitsFollowTheCounterLayout) {
  const PhiloxKey key{0x12345678, 0x9abcdef0};
  for (int64_t n : {0, 1, 3, 7, 33, 1000, 70001}) {
    std::vector<uint32_t> out(static_cast<size_t>(n) + 1, 0xdeadbeef);
    random_bits(key, out.data(), n);
    EXPECT_EQ(out[static_cast<size_t>(n)], 0xdeadbeefu) << "wrote past the end";
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t blk = static_cast<uint64_t>(i / 4);
      const auto ref = philox({static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32), 0, 0}, key);
      ASSERT_EQ(out[static_cast<size_t>(i)], ref[static_cast<size_t>(i % 4)]) << i;
    }
  }
}

TEST(Random, ReproducibleAcrossThreadsCallsAndChunking) {
  const PhiloxKey key{7, 11};
  const int64_t n = 300007;
  auto run_all = [&] {
    std::vector<uint32_t> bits(n);
    std::vector<float> u32(n), n32(n);
    std::vector<double> u64(n), n64(n);
    std::vector<uint16_t> ubf(n), nf16(n);
    std::vector<uint8_t> bern(n);
    random_bits(key, bits.data(), n);
    random_uniform(key, DType::Float32, -1, 3, u32.data(), n);
    random_uniform(key, DType::Float64, -1, 3, u64.data(), n);
    random_uniform(key, DType::BFloat16, -1, 3, ubf.data(), n);
    random_normal(key, DType::Float32, 0, 1, n32.data(), n);
    random_normal(key, DType::Float64, 0, 1, n64.data(), n);
    random_normal(key, DType::Float16, 0, 1, nf16.data(), n);
    const float p = 0.25f;
    random_bernoulli(key, DType::Float32, &p, true, reinterpret_cast<bool*>(bern.data()), n);
    std::vector<uint8_t> all;
    auto append = [&](const auto& v) {
      const auto* b = reinterpret_cast<const uint8_t*>(v.data());
      all.insert(all.end(), b, b + v.size() * sizeof(v[0]));
    };
    append(bits), append(u32), append(n32), append(u64), append(n64), append(ubf), append(nf16), append(bern);
    return all;
  };
  std::vector<uint8_t> one, two, again;
  with_threads(1, [&] { one = run_all(); });
  with_threads(2, [&] { two = run_all(); });
  with_threads(2, [&] { again = run_all(); });
  EXPECT_TRUE(one == two);
  EXPECT_TRUE(two == again);

  // A prefix of a longer stream equals the shorter stream (odd n for Box-Muller pairs).
  std::vector<uint32_t> b1(1000), b2(5000);
  random_bits(key, b1.data(), 1000);
  random_bits(key, b2.data(), 5000);
  EXPECT_TRUE(std::equal(b1.begin(), b1.end(), b2.begin()));
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    std::vector<double> s(999), l(5000);
    random_normal(key, dt, 1, 2, s.data(), 999);
    random_normal(key, dt, 1, 2, l.data(), 5000);
    EXPECT_EQ(std::memcmp(s.data(), l.data(), 999 * itemsize(dt)), 0) << name(dt);
    random_uniform(key, dt, 0, 1, s.data(), 999);
    random_uniform(key, dt, 0, 1, l.data(), 5000);
    EXPECT_EQ(std::memcmp(s.data(), l.data(), 999 * itemsize(dt)), 0) << name(dt);
  }
}

TEST(Random, SplitKeysAreDistinctAndUncorrelated) {
  const PhiloxKey key{42, 0};
  const int64_t nk = 1001;
  std::vector<uint32_t> keys(2 * nk);
  split_key(key, keys.data(), nk);
  std::set<uint64_t> seen;
  for (int64_t j = 0; j < nk; ++j) {
    const auto ref = philox({static_cast<uint32_t>(j), 0, 1, 0}, key);
    ASSERT_EQ(keys[2 * j], ref[0]);
    ASSERT_EQ(keys[2 * j + 1], ref[1]);
    seen.insert((static_cast<uint64_t>(keys[2 * j]) << 32) | keys[2 * j + 1]);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(nk));
  // Split keys differ from the parent's own bits stream.
  std::vector<uint32_t> parent(4);
  random_bits(key, parent.data(), 4);
  EXPECT_NE(parent[0], keys[0]);

  // Streams of two sibling keys and of the parent: correlation ~ N(0, 1/n).
  const int64_t n = 200000;
  std::vector<double> a(n), b(n), c(n);
  random_uniform({keys[0], keys[1]}, DType::Float64, 0, 1, a.data(), n);
  random_uniform({keys[2], keys[3]}, DType::Float64, 0, 1, b.data(), n);
  random_uniform(key, DType::Float64, 0, 1, c.data(), n);
  auto corr = [&](const std::vector<double>& x, const std::vector<double>& y) {
    double sxy = 0;
    for (int64_t i = 0; i < n; ++i) sxy += (x[i] - 0.5) * (y[i] - 0.5);
    return (sxy / n) / (1.0 / 12.0);
  };
  const double tol = 5.0 / std::sqrt(static_cast<double>(n));
  EXPECT_LT(std::fabs(corr(a, b)), tol);
  EXPECT_LT(std::fabs(corr(a, c)), tol);
  EXPECT_LT(std::fabs(corr(b, c)), tol);
  std::vector<uint32_t> split_again(2 * nk);
  with_threads(2, [&] { split_key(key, split_again.data(), nk); });
  EXPECT_EQ(split_again, keys);
}

TEST(Random, UniformRangeAndMoments) {
  const int64_t n = 1000000;
  const double lo = -3, hi = 5;
  const double mean = (lo + hi) / 2, var = (hi - lo) * (hi - lo) / 12;
  const double mean_tol = 5 * std::sqrt(var / n);
  const double var_tol = 5 * std::sqrt((std::pow(hi - lo, 4) / 80 - var * var) / n);
  {
    std::vector<float> x(n);
    random_uniform({1, 2}, DType::Float32, lo, hi, x.data(), n);
    const Moments m = moments(x, f32d);
    EXPECT_GE(m.min, lo);
    EXPECT_LT(m.max, hi);
    EXPECT_NEAR(m.mean, mean, mean_tol);
    EXPECT_NEAR(m.var, var, var_tol);
  }
  {
    std::vector<double> x(n);
    random_uniform({3, 4}, DType::Float64, lo, hi, x.data(), n);
    const Moments m = moments(x, f64d);
    EXPECT_GE(m.min, lo);
    EXPECT_LT(m.max, hi);
    EXPECT_NEAR(m.mean, mean, mean_tol);
    EXPECT_NEAR(m.var, var, var_tol);
  }
  {
    // bf16 has 8 significant bits: [1, 2) would round up to 2 without the clamp.
    std::vector<bfloat16> x(200000);
    random_uniform({5, 6}, DType::BFloat16, 1, 2, x.data(), 200000);
    const Moments m = moments(x, bf16d);
    EXPECT_GE(m.min, 1.0);
    EXPECT_LT(m.max, 2.0);
    EXPECT_EQ(m.max, 2.0 - 0x1p-7);
    EXPECT_NEAR(m.mean, 1.5, 0.01);
  }
  {
    std::vector<float16> x(200000);
    random_uniform({5, 6}, DType::Float16, 0, 1, x.data(), 200000);
    const Moments m = moments(x, f16d);
    EXPECT_GE(m.min, 0.0);
    EXPECT_LT(m.max, 1.0);
    EXPECT_NEAR(m.mean, 0.5, 0.01);
  }
  float same[3];
  random_uniform({1, 1}, DType::Float32, 2.5, 2.5, same, 3);
  EXPECT_EQ(same[2], 2.5f);
  float dummy = 0;
  EXPECT_THROW(random_uniform({1, 1}, DType::Float32, 1, 0, &dummy, 1), ValueError);
  EXPECT_THROW(random_uniform({1, 1}, DType::Float32, NAN, 1, &dummy, 1), ValueError);
  EXPECT_THROW(random_uniform({1, 1}, DType::Int32, 0, 1, &dummy, 1), DTypeError);
  EXPECT_THROW(random_uniform({1, 1}, DType::Float32, 0, 1, &dummy, -1), ValueError);
  EXPECT_NO_THROW(random_uniform({1, 1}, DType::Float32, 0, 1, nullptr, 0));
}

TEST(Random, NormalMoments) {
  const int64_t n = 1000000;
  const double mu = 2, sigma = 3;
  {
    std::vector<float> x(n);
    random_normal({9, 9}, DType::Float32, mu, sigma, x.data(), n);
    const Moments m = moments(x, f32d);
    EXPECT_TRUE(std::isfinite(m.min) && std::isfinite(m.max));
    EXPECT_NEAR(m.mean, mu, 5 * sigma / std::sqrt(n));
    EXPECT_NEAR(m.var, sigma * sigma, 5 * sigma * sigma * std::sqrt(2.0 / n));
    EXPECT_NEAR(m.kurtosis, 3.0, 5 * std::sqrt(24.0 / n));
  }
  {
    std::vector<double> x(n + 1);  // odd: the last element uses half a pair
    random_normal({10, 9}, DType::Float64, mu, sigma, x.data(), n + 1);
    const Moments m = moments(x, f64d);
    EXPECT_TRUE(std::isfinite(m.min) && std::isfinite(m.max));
    EXPECT_NEAR(m.mean, mu, 5 * sigma / std::sqrt(n));
    EXPECT_NEAR(m.var, sigma * sigma, 5 * sigma * sigma * std::sqrt(2.0 / n));
    EXPECT_NEAR(m.kurtosis, 3.0, 5 * std::sqrt(24.0 / n));
    // The two halves of each Box-Muller pair are uncorrelated.
    double s = 0;
    for (int64_t i = 0; i + 1 < n; i += 2) s += (x[i] - mu) * (x[i + 1] - mu);
    EXPECT_LT(std::fabs(s / (n / 2) / (sigma * sigma)), 5 / std::sqrt(n / 2.0));
  }
  {
    std::vector<bfloat16> x(100000);
    random_normal({11, 9}, DType::BFloat16, 0, 1, x.data(), 100000);
    const Moments m = moments(x, bf16d);
    EXPECT_NEAR(m.mean, 0, 0.02);
    EXPECT_NEAR(m.var, 1, 0.03);
  }
  float d = 0;
  EXPECT_THROW(random_normal({1, 1}, DType::Float32, 0, -1, &d, 1), ValueError);
  EXPECT_THROW(random_normal({1, 1}, DType::UInt8, 0, 1, &d, 1), DTypeError);
}

TEST(Random, BernoulliFrequencies) {
  const int64_t n = 1000000;
  std::vector<uint8_t> raw(n);
  bool* out = reinterpret_cast<bool*>(raw.data());
  auto count = [&](int64_t begin, int64_t step) {
    int64_t c = 0, total = 0;
    for (int64_t i = begin; i < n; i += step, ++total) c += raw[i];
    return std::pair<double, double>(static_cast<double>(c), static_cast<double>(total));
  };
  const double p = 0.3;
  random_bernoulli({1, 2}, DType::Float64, &p, true, out, n);
  auto [c, t] = count(0, 1);
  EXPECT_NEAR(c / t, p, 5 * std::sqrt(p * (1 - p) / t));
  for (uint8_t v : raw) ASSERT_LE(v, 1);

  const float zero = 0.0f, one = 1.0f;
  random_bernoulli({1, 2}, DType::Float32, &zero, true, out, 1000);
  EXPECT_EQ(std::count(raw.begin(), raw.begin() + 1000, 1), 0);
  random_bernoulli({1, 2}, DType::Float32, &one, true, out, 1000);
  EXPECT_EQ(std::count(raw.begin(), raw.begin() + 1000, 1), 1000);

  // Per-element p: alternating 0.1 / 0.9.
  std::vector<float> ps(n);
  for (int64_t i = 0; i < n; ++i) ps[i] = (i % 2) ? 0.9f : 0.1f;
  random_bernoulli({3, 4}, DType::Float32, ps.data(), false, out, n);
  auto [c0, t0] = count(0, 2);
  auto [c1, t1] = count(1, 2);
  EXPECT_NEAR(c0 / t0, 0.1, 5 * std::sqrt(0.09 / t0));
  EXPECT_NEAR(c1 / t1, 0.9, 5 * std::sqrt(0.09 / t1));

  const float bad = 1.5f;
  EXPECT_THROW(random_bernoulli({1, 2}, DType::Float32, &bad, true, out, 10), ValueError);
  ps[77] = NAN;
  EXPECT_THROW(random_bernoulli({1, 2}, DType::Float32, ps.data(), false, out, n), ValueError);
}

}  // namespace
}  // namespace tessera::cpu
