// scaled_dot_product_attention with segment ids (documents packed in one row): query
// t sees key s only when segments[b, s] == segments[b, t] (and causality and the mask
// allow it). Checked against a float64 reference with materialized scores, against the
// dense bool mask built from the same ids (the kernels' tile skipping must not change
// anything), by finite differences, and for the errors of a bad call.
#include <cmath>

#include "test_util.h"

namespace tessera::test {
namespace {

// Float64 attention of q [B, H, T, D], k, v [B, Hkv, T, D] with visibility
// visible(b, t, s); a row with no visible key gives 0.
std::vector<double> ref_packed_attention(const std::vector<double>& q, const std::vector<double>& k,
                                         const std::vector<double>& v, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                         int64_t D, const std::function<bool(int64_t, int64_t, int64_t)>& visible) {
  std::vector<double> out(static_cast<size_t>(B * H * T * D), 0.0);
  const double scale = 1 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> sc(T, -INFINITY);
        double m = -INFINITY;
        for (int64_t s = 0; s < T; ++s) {
          if (!visible(b, t, s)) continue;
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += q[((b * H + h) * T + t) * D + d] * k[((b * Hkv + hk) * T + s) * D + d];
          sc[s] = acc * scale;
          m = std::max(m, sc[s]);
        }
        if (m == -INFINITY) continue;
        double z = 0;
        for (int64_t s = 0; s < T; ++s) z += std::exp(sc[s] - m);
        for (int64_t s = 0; s < T; ++s) {
          const double p = std::exp(sc[s] - m) / z;
          if (p == 0) continue;
          for (int64_t d = 0; d < D; ++d) out[((b * H + h) * T + t) * D + d] += p * v[((b * Hkv + hk) * T + s) * D + d];
        }
      }
    }
  return out;
}

// Sorted ids: documents of the given lengths, one after the other, in each of B rows
// (row b's lengths rotated by b so the rows differ).
std::vector<int32_t> packed_ids(int64_t B, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t len = lengths[(i + static_cast<size_t>(b)) % lengths.size()];
      for (int64_t j = 0; j < len; ++j) ids.push_back(static_cast<int32_t>(i));
    }
  return ids;
}

// Unsorted ids in [0, n): runs of random lengths with random ids (a document may recur).
std::vector<int32_t> shuffled_ids(int64_t B, int64_t T, int64_t n, uint32_t seed) {
  auto draws = random_ints(B * T, seed, 0, 4 * n - 1);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = draws[static_cast<size_t>(b * T + t)];
      if (t == 0 || r < n) id = static_cast<int32_t>(r % n);  // a new run about 1 token in 4
      ids[static_cast<size_t>(b * T + t)] = id;
    }
  }
  return ids;
}

// The dense mask [B, 1, T, T] the ids stand for.
Array mask_of(const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  std::vector<bool> m(static_cast<size_t>(B * T * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < T; ++s) m[static_cast<size_t>((b * T + t) * T + s)] = ids[b * T + t] == ids[b * T + s];
  return Array::from_vector<bool>(m, {B, 1, T, T});
}

struct SegCase {
  int64_t B, H, Hkv, T, D;
  bool causal, masked;
  std::vector<int32_t> ids;
  const char* what;
};

std::vector<SegCase> cases() {
  return {
      {1, 1, 1, 1, 8, true, false, {5}, "one token"},
      {2, 2, 2, 9, 8, true, false, packed_ids(2, {3, 2, 4}), "three short documents"},
      {2, 2, 2, 9, 8, false, false, packed_ids(2, {3, 2, 4}), "not causal"},
      {1, 4, 2, 150, 16, true, false, packed_ids(1, {40, 70, 1, 39}), "documents across tiles, GQA"},
      {2, 2, 1, 200, 8, true, false, shuffled_ids(2, 200, 5, 11), "unsorted ids, T > tiles"},
      {1, 2, 2, 130, 8, false, true, shuffled_ids(1, 130, 3, 12), "unsorted ids with a mask, not causal"},
      {2, 2, 2, 140, 8, true, true, packed_ids(2, {64, 64, 12}), "tile-aligned documents with a mask"},
  };
}

TEST(AttentionSegments, VsNaive) {
  uint32_t seed = 900;
  for (DType dt : {DType::Float64, DType::Float32, DType::BFloat16}) {
    for (const SegCase& c : cases()) {
      auto q = round_to(random_values(c.B * c.H * c.T * c.D, seed++, -2, 2), dt);
      auto k = round_to(random_values(c.B * c.Hkv * c.T * c.D, seed++, -2, 2), dt);
      auto v = round_to(random_values(c.B * c.Hkv * c.T * c.D, seed++), dt);
      std::vector<bool> mask_bits;
      std::optional<Array> mask;
      if (c.masked) {  // [B, 1, T, T], about 3/4 attend; row 1 hides everything
        for (auto x : random_ints(c.B * c.T * c.T, seed++, 0, 3)) mask_bits.push_back(x != 0);
        for (int64_t s = 0; s < c.T; ++s) mask_bits[static_cast<size_t>(c.T + s)] = false;
        mask = Array::from_vector<bool>(mask_bits, {c.B, 1, c.T, c.T});
      }
      const std::vector<int32_t>& ids = c.ids;
      Array segments = Array::from_vector<int32_t>(ids, {c.B, c.T});
      Array out = scaled_dot_product_attention(
          make_array(q, {c.B, c.H, c.T, c.D}, dt), make_array(k, {c.B, c.Hkv, c.T, c.D}, dt),
          make_array(v, {c.B, c.Hkv, c.T, c.D}, dt), c.causal, mask, std::nullopt, segments);
      EXPECT_EQ(out.dtype(), dt);
      const int64_t T = c.T;
      auto expected = ref_packed_attention(q, k, v, c.B, c.H, c.Hkv, T, c.D, [&](int64_t b, int64_t t, int64_t s) {
        if (c.causal && s > t) return false;
        if (!mask_bits.empty() && !mask_bits[static_cast<size_t>((b * T + t) * T + s)]) return false;
        return ids[b * T + t] == ids[b * T + s];
      });
      const double tol = dt == DType::Float64 ? 1e-12 : dt == DType::Float32 ? 1e-4 : 2e-2;
      EXPECT_TRUE(all_close(out, expected, tol, tol)) << name(dt) << " " << c.what;
    }
  }
}

// The same call with the mask built from the ids: the forward and all three gradients
// agree (tiles the ids skip hold exact zeros in the masked call).
TEST(AttentionSegments, EqualsDenseMask) {
  uint32_t seed = 950;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (const SegCase& c : cases()) {
      if (c.masked) continue;
      Array q = random_array({c.B, c.H, c.T, c.D}, seed++, dt), k = random_array({c.B, c.Hkv, c.T, c.D}, seed++, dt),
            v = random_array({c.B, c.Hkv, c.T, c.D}, seed++, dt);
      Array ct = random_array({c.B, c.H, c.T, c.D}, seed++, dt);
      Array segments = Array::from_vector<int32_t>(c.ids, {c.B, c.T});
      Array mask = mask_of(c.ids, c.B, c.T);
      const bool causal = c.causal;
      auto loss_of = [&](bool use_segments) {
        return [=](const std::vector<Array>& xs) {
          Array o = use_segments ? scaled_dot_product_attention(xs[0], xs[1], xs[2], causal, std::nullopt, std::nullopt,
                                                                segments)
                                 : scaled_dot_product_attention(xs[0], xs[1], xs[2], causal, mask);
          return sum(astype(o, DType::Float32) * astype(ct, DType::Float32));
        };
      };
      auto [seg_loss, seg_grads] = value_and_grad(ScalarFn(loss_of(true)))({q, k, v});
      auto [mask_loss, mask_grads] = value_and_grad(ScalarFn(loss_of(false)))({q, k, v});
      EXPECT_TRUE(all_close(seg_loss, mask_loss, 1e-6, 1e-6)) << name(dt) << " " << c.what;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_TRUE(all_close(seg_grads[i], mask_grads[i], 1e-6, 1e-6))
            << name(dt) << " " << c.what << " gradient of input " << i;
    }
  }
}

TEST(AttentionSegments, GradientsByFiniteDifferences) {
  struct Case {
    int64_t H, Hkv, T;
    bool causal;
    std::vector<int32_t> ids;
  };
  uint32_t seed = 980;
  for (const Case& c : std::vector<Case>{{2, 2, 7, true, packed_ids(1, {3, 1, 3})},
                                         {2, 1, 8, false, shuffled_ids(1, 8, 3, 13)},
                                         {1, 1, 70, true, packed_ids(1, {20, 50})}}) {
    const int64_t D = 4;
    Array q = random_array({1, c.H, c.T, D}, seed++), k = random_array({1, c.Hkv, c.T, D}, seed++),
          v = random_array({1, c.Hkv, c.T, D}, seed++);
    Array segments = Array::from_vector<int32_t>(c.ids, {1, c.T});
    const bool causal = c.causal;
    // Both outputs: a cotangent into lse goes through the composite rule.
    ArrayFn f = [causal, segments](const std::vector<Array>& xs) {
      return scaled_dot_product_attention(xs[0], xs[1], xs[2], causal, std::nullopt, std::nullopt, segments).siblings();
    };
    EXPECT_TRUE(check_vjp_fd(f, {q, k, v})) << "H" << c.H << " Hkv" << c.Hkv << " T" << c.T << " causal " << causal;
    EXPECT_TRUE(check_vjp_fd(ScalarFn([causal, segments](const std::vector<Array>& xs) {
                               return scaled_dot_product_attention(xs[0], xs[1], xs[2], causal, std::nullopt,
                                                                   std::nullopt, segments);
                             }),
                             {q, k, v}))
        << "fused backward, H" << c.H << " Hkv" << c.Hkv << " T" << c.T << " causal " << causal;
  }
}

// Second order: the fused backward's own vjp is its composite, which must apply the
// segment ids too.
TEST(AttentionSegments, SecondOrderGradients) {
  Array q = random_array({1, 2, 7, 4}, 990), k = random_array({1, 2, 7, 4}, 991), v = random_array({1, 2, 7, 4}, 992);
  Array segments = Array::from_vector<int32_t>(packed_ids(1, {3, 1, 3}), {1, 7});
  ScalarFn loss = [segments](const std::vector<Array>& xs) {
    return sum(square(scaled_dot_product_attention(xs[0], xs[1], xs[2], true, std::nullopt, std::nullopt, segments)));
  };
  ArrayFn grads = [loss](const std::vector<Array>& xs) { return grad(loss)(xs); };
  EXPECT_TRUE(check_vjp_fd(grads, {q, k, v}, 1e-6, 1e-5));
}

TEST(AttentionSegments, Errors) {
  Array q = zeros({2, 2, 6, 8}), k = zeros({2, 2, 6, 8});
  Array ids = zeros({2, 6}, DType::Int32);
  auto call = [&](const Array& qq, const Array& kk, const Array& seg) {
    return scaled_dot_product_attention(qq, kk, kk, true, std::nullopt, std::nullopt, seg);
  };
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] {
        call(q, k, zeros({2, 5}, DType::Int32));
      },
      {"scaled_dot_product_attention: segment_ids of shape [2, 5]", "expected [batch 2, seq 6]"}));
  EXPECT_TRUE(throws_with<DTypeError>([&] { call(q, k, zeros({2, 6})); }, {"segment_ids have dtype float32"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        call(q, zeros({2, 2, 9, 8}), ids);
      },
      {"scaled_dot_product_attention", "T == S", "[2, 2, 9, 8]"}));
  // int64 ids are accepted (converted to int32).
  EXPECT_EQ(call(q, k, zeros({2, 6}, DType::Int64)).shape(), q.shape());
}

}  // namespace
}  // namespace tessera::test
