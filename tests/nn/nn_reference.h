// Float64 naive references for the nn/ module tests: plain loops over row-major
// vectors, written independently of tessera's ops.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace tessera::nn_ref {

using Vec = std::vector<double>;

inline size_t at(int64_t i) { return static_cast<size_t>(i); }

// [rows, k] @ [k, n] (+ bias [n]).
inline Vec linear(const Vec& x, int64_t rows, int64_t k, const Vec& w, int64_t n, const Vec* bias = nullptr) {
  Vec y(at(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias ? (*bias)[at(j)] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += x[at(r * k + i)] * w[at(i * n + j)];
      y[at(r * n + j)] = acc;
    }
  return y;
}

inline Vec layer_norm(const Vec& x, int64_t rows, int64_t d, const Vec& scale, const Vec* bias, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += x[at(r * d + i)];
    mean /= static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i) var += (x[at(r * d + i)] - mean) * (x[at(r * d + i)] - mean);
    var /= static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i)
      y[at(r * d + i)] = (x[at(r * d + i)] - mean) / std::sqrt(var + eps) * scale[at(i)] + (bias ? (*bias)[at(i)] : 0);
  }
  return y;
}

inline Vec rms_norm(const Vec& x, int64_t rows, int64_t d, const Vec& scale, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < d; ++i) ms += x[at(r * d + i)] * x[at(r * d + i)];
    ms /= static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i) y[at(r * d + i)] = x[at(r * d + i)] / std::sqrt(ms + eps) * scale[at(i)];
  }
  return y;
}

inline double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

inline double silu(double x) { return x / (1 + std::exp(-x)); }

// RoPE (rotate-half) of one head vector at `position`, in place.
inline void rope(double* v, int64_t d, int64_t position, double theta) {
  const int64_t half = d / 2;
  Vec out(at(d));
  for (int64_t j = 0; j < d; ++j) {
    const int64_t i = j % half;
    const double angle =
        static_cast<double>(position) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const double rotated = j < half ? -v[j + half] : v[j - half];
    out[at(j)] = v[j] * std::cos(angle) + rotated * std::sin(angle);
  }
  for (int64_t j = 0; j < d; ++j) v[j] = out[at(j)];
}

// Self-attention of x [B, T, D] with a fused projection wqkv [D, (H + 2 Hkv) Dh]
// (columns grouped by kv head: [Hkv, G + 2, Dh], G = H / Hkv query heads then the
// group's k and v), optional RoPE starting at position 0, a causal mask, GQA (query
// head h uses kv head h / G) and wo [D, D].
inline Vec attention(const Vec& x, int64_t b_n, int64_t t_n, int64_t d, int64_t h_n, int64_t hkv, const Vec& wqkv,
                     const Vec* bqkv, const Vec& wo, const Vec* bo, bool rope_on, double theta) {
  const int64_t dh = d / h_n, width = (h_n + 2 * hkv) * dh;
  Vec qkv = linear(x, b_n * t_n, d, wqkv, width, bqkv);  // [B*T, width]
  const int64_t group = h_n / hkv;
  auto q_at = [&](int64_t b, int64_t t, int64_t h) {
    return &qkv[at((b * t_n + t) * width + ((h / group) * (group + 2) + h % group) * dh)];
  };
  auto k_at = [&](int64_t b, int64_t t, int64_t g) {
    return &qkv[at((b * t_n + t) * width + (g * (group + 2) + group) * dh)];
  };
  auto v_at = [&](int64_t b, int64_t t, int64_t g) {
    return &qkv[at((b * t_n + t) * width + (g * (group + 2) + group + 1) * dh)];
  };
  if (rope_on)
    for (int64_t b = 0; b < b_n; ++b)
      for (int64_t t = 0; t < t_n; ++t) {
        for (int64_t h = 0; h < h_n; ++h) rope(q_at(b, t, h), dh, t, theta);
        for (int64_t g = 0; g < hkv; ++g) rope(k_at(b, t, g), dh, t, theta);
      }
  Vec merged(at(b_n * t_n * d));
  for (int64_t b = 0; b < b_n; ++b)
    for (int64_t h = 0; h < h_n; ++h) {
      const int64_t g = h / (h_n / hkv);
      for (int64_t t = 0; t < t_n; ++t) {
        Vec score(at(t + 1));
        double top = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t j = 0; j < dh; ++j) dot += q_at(b, t, h)[j] * k_at(b, s, g)[j];
          score[at(s)] = dot / std::sqrt(static_cast<double>(dh));
          top = std::max(top, score[at(s)]);
        }
        double total = 0;
        for (double& sc : score) total += (sc = std::exp(sc - top));
        for (int64_t j = 0; j < dh; ++j) {
          double acc = 0;
          for (int64_t s = 0; s <= t; ++s) acc += score[at(s)] / total * v_at(b, s, g)[j];
          merged[at((b * t_n + t) * d + h * dh + j)] = acc;
        }
      }
    }
  return linear(merged, b_n * t_n, d, wo, d, bo);
}

}  // namespace tessera::nn_ref
