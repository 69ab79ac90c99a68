// Layer norm and RMS norm over rows, forward and backward.
//
//   layer norm: mu = mean(x), rstd = 1/sqrt(mean((x - mu)^2) + eps), xhat = (x - mu) rstd,
//               y = xhat * w + b
//   RMS norm:   rstd = 1/sqrt(mean(x^2) + eps), xhat = x rstd, y = xhat * w
//   backward (g = dy * w):
//     layer norm: dx = rstd (g - mean(g) - xhat mean(g xhat))
//     RMS norm:   dx = rstd (g - xhat mean(g xhat))
//     dw = sum_rows dy xhat, db = sum_rows dy
//
// Forward: two passes over a row (the second from cache), one write: memory bound.
// dw/db are summed deterministically: rows are split into at most kMaxParamChunks
// fixed chunks (sizes depend only on rows and cols), each chunk sums its rows in
// order into its own partial, and the partials are added in chunk order.
#include <cmath>
#include <vector>

#include "backend/cpu/kernels/nn.h"
#include "backend/cpu/kernels/nn_common.h"
#include "backend/cpu/kernels/scratch.h"
#include "tessera/base/thread_pool.h"

namespace tessera::cpu {
namespace {

using namespace nn_detail;

constexpr int kLanes = 16;
constexpr int64_t kMaxParamChunks = 32;

// sum_{j<n} f(j) with kLanes interleaved accumulators (vectorizable without
// reassociation) combined in a fixed order.
template <typename A, typename F>
inline A lane_sum(int64_t n, F&& f) {
  A acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += f(j + l);
  }
  for (int l = 0; j + l < n; ++l) acc[l] += f(j + l);
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

// Two sums in one pass: (sum f(j), sum g(j)).
template <typename A, typename F, typename G>
inline void lane_sum2(int64_t n, F&& f, G&& g, A& sf, A& sg) {
  A af[kLanes] = {}, ag[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      af[l] += f(j + l);
      ag[l] += g(j + l);
    }
  }
  for (int l = 0; j + l < n; ++l) {
    af[l] += f(j + l);
    ag[l] += g(j + l);
  }
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) {
      af[l] += af[l + w];
      ag[l] += ag[l + w];
    }
  }
  sf = af[0];
  sg = ag[0];
}

template <typename A>
void layer_norm_row(const A* x, const A* w, const A* b, A* y, int64_t n, A eps, A& mean_out, A& rstd_out) {
  const A mu = lane_sum<A>(n, [&](int64_t j) { return x[j]; }) / static_cast<A>(n);
  const A var = lane_sum<A>(n,
                            [&](int64_t j) {
                              A d = x[j] - mu;
                              return d * d;
                            }) /
                static_cast<A>(n);
  const A rstd = A(1) / std::sqrt(var + eps);
  if (w && b) {
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mu) * rstd * w[j] + b[j];
  } else if (w) {
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mu) * rstd * w[j];
  } else if (b) {
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mu) * rstd + b[j];
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mu) * rstd;
  }
  mean_out = mu;
  rstd_out = rstd;
}

template <typename A>
void rms_norm_row(const A* x, const A* w, A* y, int64_t n, A eps, A& rstd_out) {
  const A ms = lane_sum<A>(n, [&](int64_t j) { return x[j] * x[j]; }) / static_cast<A>(n);
  const A rstd = A(1) / std::sqrt(ms + eps);
  if (w) {
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] * rstd * w[j];
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] * rstd;
  }
  rstd_out = rstd;
}

// One row of the backward. mu = 0 and centered = false give RMS norm. w is non-null
// (ones when the norm has no weight); dw/db (nullable) are this chunk's running partials.
template <typename A>
void norm_row_backward(const A* __restrict__ x, const A* __restrict__ w, A mu, A rstd, const A* __restrict__ dy,
                       A* __restrict__ dx, A* __restrict__ dw, A* __restrict__ db, int64_t n, bool centered) {
  const A inv_n = A(1) / static_cast<A>(n);
  auto g = [&](int64_t j) { return dy[j] * w[j]; };
  auto xhat = [&](int64_t j) { return (x[j] - mu) * rstd; };
  A sum_g = 0, sum_gx = 0;
  lane_sum2<A>(
      n, g, [&](int64_t j) { return g(j) * xhat(j); }, sum_g, sum_gx);
  const A mean_g = centered ? sum_g * inv_n : A(0);
  const A mean_gx = sum_gx * inv_n;
  if (dw && db) {
    for (int64_t j = 0; j < n; ++j) {
      const A xh = xhat(j);
      dx[j] = rstd * (g(j) - mean_g - xh * mean_gx);
      dw[j] += dy[j] * xh;
      db[j] += dy[j];
    }
  } else if (dw) {
    for (int64_t j = 0; j < n; ++j) {
      const A xh = xhat(j);
      dx[j] = rstd * (g(j) - mean_g - xh * mean_gx);
      dw[j] += dy[j] * xh;
    }
  } else if (db) {  // a bias without a weight
    for (int64_t j = 0; j < n; ++j) {
      dx[j] = rstd * (g(j) - mean_g - xhat(j) * mean_gx);
      db[j] += dy[j];
    }
  } else {
    for (int64_t j = 0; j < n; ++j) dx[j] = rstd * (g(j) - mean_g - xhat(j) * mean_gx);
  }
}

// Parameters (w, b) as A: the buffer itself for float32/float64, a widened copy otherwise.
template <typename T>
const Acc<T>* param_as_acc(const void* p, int64_t n, Scratch slot) {
  if (!p) return nullptr;
  if constexpr (kIsHalf<T>) {
    float* storage = thread_scratch<float>(static_cast<size_t>(n), slot);
    widen(static_cast<const T*>(p), storage, n);
    return storage;
  } else {
    return static_cast<const T*>(p);
  }
}

// Forward driver for both norms (b ignored and mean null for RMS norm).
template <typename T>
void norm_forward(const void* xv, const void* wv, const void* bv, void* yv, void* meanv, void* rstdv, int64_t rows,
                  int64_t cols, double eps, bool centered) {
  using A = Acc<T>;
  const A* w = param_as_acc<T>(wv, cols, Scratch::NormWeight);
  const A* b = param_as_acc<T>(bv, cols, Scratch::NormBias);
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  A* mean = static_cast<A*>(meanv);
  A* rstd = static_cast<A*>(rstdv);
  parallel_for_widened<T>(rows, row_grain(cols), 2 * cols, Scratch::NormChunks,
                          [&](int64_t begin, int64_t end, float* scratch) {
                            for (int64_t r = begin; r < end; ++r) {
                              const A* xr;
                              A* yr;
                              if constexpr (kIsHalf<T>) {
                                float* xs = scratch;
                                widen(x + r * cols, xs, cols);
                                xr = xs;
                                yr = scratch + cols;
                              } else {
                                xr = x + r * cols;
                                yr = y + r * cols;
                              }
                              A mu = 0, rs = 0;
                              if (centered) {
                                layer_norm_row(xr, w, b, yr, cols, static_cast<A>(eps), mu, rs);
                              } else {
                                rms_norm_row(xr, w, yr, cols, static_cast<A>(eps), rs);
                              }
                              if constexpr (kIsHalf<T>) narrow(yr, y + r * cols, cols);
                              if (mean) mean[r] = mu;
                              if (rstd) rstd[r] = rs;
                            }
                          });
}

template <typename T>
void norm_backward(const void* xv, const void* wv, const void* meanv, const void* rstdv, const void* dyv, void* dxv,
                   void* dwv, void* dbv, int64_t rows, int64_t cols, bool centered) {
  using A = Acc<T>;
  const A* w = param_as_acc<T>(wv, cols, Scratch::NormWeight);
  if (!w) {  // a branch-free row loop vectorizes; the multiply by 1 is exact
    A* ones = thread_scratch<A>(static_cast<size_t>(cols), Scratch::NormOnes);
    std::fill(ones, ones + cols, A(1));
    w = ones;
  }
  const T* x = static_cast<const T*>(xv);
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  const A* mean = static_cast<const A*>(meanv);
  const A* rstd = static_cast<const A*>(rstdv);
  const bool want_dw = dwv != nullptr, want_db = dbv != nullptr && centered;

  // Chunking depends on rows and cols only (see the file comment).
  const int64_t grain = std::max(row_grain(cols), (rows + kMaxParamChunks - 1) / kMaxParamChunks);
  const int64_t chunks = num_chunks(rows, grain);
  // Per-chunk partial sums (zeroed: rows accumulate into them).
  const size_t part_size = static_cast<size_t>(chunks * cols);
  A* dw_part = want_dw ? thread_scratch<A>(part_size, Scratch::NormWeightGrad) : nullptr;
  A* db_part = want_db ? thread_scratch<A>(part_size, Scratch::NormBiasGrad) : nullptr;
  if (dw_part) std::fill(dw_part, dw_part + part_size, A(0));
  if (db_part) std::fill(db_part, db_part + part_size, A(0));

  parallel_for_widened<T>(rows, grain, 3 * cols, Scratch::NormChunks, [&](int64_t begin, int64_t end, float* scratch) {
    const int64_t c = begin / grain;
    A* dw = want_dw ? dw_part + c * cols : nullptr;
    A* db = want_db ? db_part + c * cols : nullptr;
    for (int64_t r = begin; r < end; ++r) {
      const A* xr;
      const A* dyr;
      A* dxr;
      if constexpr (kIsHalf<T>) {
        float* xs = scratch;
        float* ds = scratch + cols;
        widen(x + r * cols, xs, cols);
        widen(dy + r * cols, ds, cols);
        xr = xs;
        dyr = ds;
        dxr = scratch + 2 * cols;
      } else {
        xr = x + r * cols;
        dyr = dy + r * cols;
        dxr = dx + r * cols;
      }
      norm_row_backward(xr, w, centered ? mean[r] : A(0), rstd[r], dyr, dxr, dw, db, cols, centered);
      if constexpr (kIsHalf<T>) narrow(dxr, dx + r * cols, cols);
    }
  });

  // Sum the partials in chunk order; parallel over columns (each column's order is fixed).
  auto combine = [&](const A* part, void* out) {
    T* o = static_cast<T*>(out);
    parallel_for(cols, std::max<int64_t>(256, row_grain(chunks)), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        A s = 0;
        for (int64_t c = 0; c < chunks; ++c) s += part[static_cast<size_t>(c * cols + j)];
        o[j] = from_acc<T>(s);
      }
    });
  };
  if (want_dw) combine(dw_part, dwv);
  if (want_db) combine(db_part, dbv);
}

// Rows of length 0 have no mean: rejected rather than producing NaN statistics.
void check_norm(const char* op, int64_t rows, int64_t cols) {
  check_rows(op, rows, cols);
  if (rows > 0 && cols == 0) fail<ValueError>("{}: cannot normalize rows of length 0 (got rows={}, cols=0)", op, rows);
}

void check_stat(const char* op, int64_t rows, const void* stat) {
  if (rows > 0 && !stat) fail<ValueError>("{}: the saved statistics buffer is null", op);
}

}  // namespace

void layer_norm_rows(DType dtype, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                     int64_t rows, int64_t cols, double eps) {
  check_norm("layer_norm", rows, cols);
  dispatch_float(dtype, "layer_norm",
                 [&](auto tag) { norm_forward<decltype(tag)>(x, w, b, y, mean, rstd, rows, cols, eps, true); });
}

void layer_norm_rows_backward(DType dtype, const void* x, const void* w, const void* mean, const void* rstd,
                              const void* dy, void* dx, void* dw, void* db, int64_t rows, int64_t cols) {
  check_norm("layer_norm_backward", rows, cols);
  check_stat("layer_norm_backward", rows, mean);
  check_stat("layer_norm_backward", rows, rstd);
  dispatch_float(dtype, "layer_norm_backward",
                 [&](auto tag) { norm_backward<decltype(tag)>(x, w, mean, rstd, dy, dx, dw, db, rows, cols, true); });
}

void rms_norm_rows(DType dtype, const void* x, const void* w, void* y, void* rstd, int64_t rows, int64_t cols,
                   double eps) {
  check_norm("rms_norm", rows, cols);
  dispatch_float(dtype, "rms_norm", [&](auto tag) {
    norm_forward<decltype(tag)>(x, w, nullptr, y, nullptr, rstd, rows, cols, eps, false);
  });
}

void rms_norm_rows_backward(DType dtype, const void* x, const void* w, const void* rstd, const void* dy, void* dx,
                            void* dw, int64_t rows, int64_t cols) {
  check_norm("rms_norm_backward", rows, cols);
  check_stat("rms_norm_backward", rows, rstd);
  dispatch_float(dtype, "rms_norm_backward", [&](auto tag) {
    norm_backward<decltype(tag)>(x, w, nullptr, rstd, dy, dx, dw, nullptr, rows, cols, false);
  });
}

}  // namespace tessera::cpu
