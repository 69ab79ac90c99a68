// Layer norm / RMS norm kernels (see norm.h for the math and the layouts).
//
// Forward: one block per row, three passes over the row (sum, centered sum of squares,
// write); the second and third read the row from L1/L2. Statistics in the
// accumulation type with a deterministic block reduction.
//
// Backward: rows of up to 1024 16-bit columns (512 float32) take a warp each
// (norm_backward_warp_kernel, below); longer rows take one block per chunk of rows. For
// each row the block reduces sum(g) and sum(g xhat), then writes dx and adds dy xhat / dy
// into the chunk's dw / db accumulators. Thread t always owns the same columns (vectors
// t, t + blockDim, ...), so the accumulators need no synchronization: they live in shared
// memory when they fit (else in the chunk's partial row in global scratch) and each
// thread copies its own columns out at the end. column_sum_kernel then adds the chunk
// partials in chunk order: the result is independent of scheduling.
#include <initializer_list>
#include <string>

#include "backend/cuda/kernels/norm.h"
#include "backend/cuda/kernels/row_common.cuh"

namespace tessera::cuda {
namespace {

using rows::Acc;

constexpr int64_t kMaxChunks = 512;
constexpr size_t kPartialBudget = size_t{32} << 20;  // bytes of dw+db partials at most
constexpr size_t kSharedAccBytes = 40 << 10;         // accumulators in shared memory up to this size
constexpr int kSumRows = 16;                         // threadIdx.y extent of column_sum_kernel

template <typename T, int V>
__global__ void norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                    T* __restrict__ y, Acc<T>* __restrict__ mean, Acc<T>* __restrict__ rstd,
                                    int64_t n_rows, int64_t cols, Acc<T> eps, bool centered) {
  using A = Acc<T>;
  __shared__ A red[33];
  const int64_t nvec = cols / V;  // V divides cols (the launcher checks)
  const A n = static_cast<A>(cols);
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    A mu = 0;
    if (centered) {
      A s = 0;
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        A xv[V];
        rows::load_vec<V>(xr + v * V, xv);
#pragma unroll
        for (int k = 0; k < V; ++k) s += xv[k];
      }
      mu = rows::block_sum(s, red) / n;
    }
    A q = 0;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      A xv[V];
      rows::load_vec<V>(xr + v * V, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A d = xv[k] - mu;
        q += d * d;
      }
    }
    const A rs = A(1) / rows::sqrt_(rows::block_sum(q, red) / n + eps);
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      A xv[V], out[V];
      rows::load_vec<V>(xr + v * V, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = (xv[k] - mu) * rs;
      if (w != nullptr) {
        A wv[V];
        rows::load_vec<V>(w + v * V, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] *= wv[k];
      }
      if (b != nullptr) {
        A bv[V];
        rows::load_vec<V>(b + v * V, bv);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] += bv[k];
      }
      rows::store_vec<V>(yr + v * V, out);
    }
    if (threadIdx.x == 0) {
      if (mean != nullptr) mean[r] = mu;
      if (rstd != nullptr) rstd[r] = rs;
    }
  }
}

// Block c handles rows [c * rows_per_chunk, min(n_rows, (c + 1) * rows_per_chunk)).
// dw_part / db_part: [chunks, cols] partial sums (null when not wanted).
template <typename T, int V>
__global__ void norm_backward_kernel(const T* __restrict__ x, const T* __restrict__ w, const Acc<T>* __restrict__ mean,
                                     const Acc<T>* __restrict__ rstd, const T* __restrict__ dy, T* __restrict__ dx,
                                     Acc<T>* __restrict__ dw_part, Acc<T>* __restrict__ db_part, int64_t n_rows,
                                     int64_t cols, int64_t rows_per_chunk, bool centered, bool shared_acc) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  __shared__ A red[33];
  const int64_t c = blockIdx.x;
  const int64_t r0 = c * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n_rows ? r0 + rows_per_chunk : n_rows;
  const int64_t nvec = cols / V;
  const A n = static_cast<A>(cols);

  A* acc_dw = nullptr;
  A* acc_db = nullptr;
  if (shared_acc) {
    A* s = reinterpret_cast<A*>(shared_raw);
    if (dw_part != nullptr) acc_dw = s;
    if (db_part != nullptr) acc_db = s + (dw_part != nullptr ? cols : 0);
  } else {
    if (dw_part != nullptr) acc_dw = dw_part + c * cols;
    if (db_part != nullptr) acc_db = db_part + c * cols;
  }
  // Each thread zeroes, accumulates and copies out only its own columns.
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (acc_dw != nullptr) acc_dw[v * V + k] = A(0);
      if (acc_db != nullptr) acc_db[v * V + k] = A(0);
    }
  }

  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    const A mu = centered ? mean[r] : A(0);
    const A rs = rstd[r];
    A sg = 0, sgx = 0;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      A xv[V], dv[V];
      rows::load_vec<V>(xr + v * V, xv);
      rows::load_vec<V>(dyr + v * V, dv);
      if (w != nullptr) {
        A wv[V];
        rows::load_vec<V>(w + v * V, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) dv[k] *= wv[k];
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        sg += dv[k];
        sgx += dv[k] * ((xv[k] - mu) * rs);
      }
    }
    sg = rows::block_sum(sg, red);
    sgx = rows::block_sum(sgx, red);
    const A mean_g = centered ? sg / n : A(0);
    const A mean_gx = sgx / n;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      A xv[V], dv[V], g[V], out[V];
      rows::load_vec<V>(xr + v * V, xv);
      rows::load_vec<V>(dyr + v * V, dv);
      if (w != nullptr) {
        A wv[V];
        rows::load_vec<V>(w + v * V, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = dv[k] * wv[k];
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = dv[k];
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A xh = (xv[k] - mu) * rs;
        out[k] = rs * (g[k] - mean_g - xh * mean_gx);
        if (acc_dw != nullptr) acc_dw[v * V + k] += dv[k] * xh;
        if (acc_db != nullptr) acc_db[v * V + k] += dv[k];
      }
      rows::store_vec<V>(dxr + v * V, out);
    }
  }

  if (shared_acc) {
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (acc_dw != nullptr) dw_part[c * cols + v * V + k] = acc_dw[v * V + k];
        if (acc_db != nullptr) db_part[c * cols + v * V + k] = acc_db[v * V + k];
      }
    }
  }
}

constexpr int kRowWarps = 8;        // warps per block of norm_backward_warp_kernel
constexpr int kMaxLaneVectors = 4;  // its rows: at most 32 * 4 vectors (1024 bf16 columns)

// The backward with one warp per row, for rows of at most 32 * NV vectors (GPT-2's 768
// bf16 columns: 3 vectors of 8 per lane). Lane l owns vectors l, l + 32, ... of every
// row, so the row sums are warp butterflies (no block barrier per row), the row's x and
// dy are read once (held in registers for the second half), and the lane's dw / db
// accumulators live in registers. Block c handles the rows of chunk c as
// norm_backward_kernel does (warp w takes rows r0 + w, r0 + w + kRowWarps, ...); its
// warps then add their accumulators into shared memory in warp order and the block
// writes the chunk's partial row. Same partial layout, fixed orders throughout: the
// result does not depend on scheduling.
template <typename T, int V, int NV>
__global__ void __launch_bounds__(kRowWarps * 32)
    norm_backward_warp_kernel(const T* __restrict__ x, const T* __restrict__ w, const Acc<T>* __restrict__ mean,
                              const Acc<T>* __restrict__ rstd, const T* __restrict__ dy, T* __restrict__ dx,
                              Acc<T>* __restrict__ dw_part, Acc<T>* __restrict__ db_part, int64_t n_rows, int64_t cols,
                              int64_t rows_per_chunk, bool centered) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  A* s_dw = reinterpret_cast<A*>(shared_raw);  // [cols]
  A* s_db = s_dw + cols;                       // [cols]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nvec = cols / V;
  const int64_t c = blockIdx.x;
  const int64_t r0 = c * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n_rows ? r0 + rows_per_chunk : n_rows;
  const A n = static_cast<A>(cols);

  A adw[NV][V], adb[NV][V];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      adw[i][k] = A(0);
      adb[i][k] = A(0);
    }
  }
  // g = dy w: w is re-read for each row (from L1) rather than held, which keeps the
  // registers under 128 so that 16 warps fit on an SM.
  auto times_w = [&](int64_t v, A(&d)[V], A(&g)[V]) {
    if (w != nullptr) {
      rows::load_vec<V>(w + v * V, g);
#pragma unroll
      for (int k = 0; k < V; ++k) g[k] *= d[k];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) g[k] = d[k];
    }
  };

  for (int64_t r = r0 + warp; r < r1; r += kRowWarps) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const A mu = centered ? mean[r] : A(0);
    const A rs = rstd[r];
    A xh[NV][V], dv[NV][V];  // xhat and dy of the lane's vectors
    A sg = 0, sgx = 0;       // the lane's part of sum(g) and sum(g xhat), g = dy w
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = lane + 32 * i;
      if (v < nvec) {
        rows::load_vec<V>(xr + v * V, xh[i]);
        rows::load_vec<V>(dyr + v * V, dv[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = lane + 32 * i;
      if (v >= nvec) continue;
      A g[V];
      times_w(v, dv[i], g);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        xh[i][k] = (xh[i][k] - mu) * rs;
        sg += g[k];
        sgx += g[k] * xh[i][k];
      }
    }
    sg = rows::warp_sum(sg);
    sgx = rows::warp_sum(sgx);
    const A mean_g = centered ? sg / n : A(0);
    const A mean_gx = sgx / n;
    T* dxr = dx + r * cols;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = lane + 32 * i;
      if (v >= nvec) continue;
      A out[V];
      times_w(v, dv[i], out);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out[k] = rs * (out[k] - mean_g - xh[i][k] * mean_gx);
        adw[i][k] += dv[i][k] * xh[i][k];
        adb[i][k] += dv[i][k];
      }
      rows::store_vec<V>(dxr + v * V, out);
    }
  }

  if (dw_part == nullptr && db_part == nullptr) return;  // uniform over the block
  // Warp 0 stores its accumulators, then warps 1, 2, ... add theirs, one at a time.
  for (int turn = 0; turn < kRowWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int64_t v = lane + 32 * i;
        if (v >= nvec) continue;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int64_t j = v * V + k;
          s_dw[j] = turn == 0 ? adw[i][k] : s_dw[j] + adw[i][k];
          s_db[j] = turn == 0 ? adb[i][k] : s_db[j] + adb[i][k];
        }
      }
    }
    __syncthreads();
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    if (dw_part != nullptr) dw_part[c * cols + j] = s_dw[j];
    if (db_part != nullptr) db_part[c * cols + j] = s_db[j];
  }
}

// out[j] = sum over c in [0, chunks) of part[c * cols + j], in a fixed order: thread row
// ty sums chunks ty, ty + kSumRows, ... in order, then row 0 adds the kSumRows partials
// in order. Block (32, kSumRows) per tile of 32 columns. chunks may be 0 (zeros).
template <typename T>
__global__ void column_sum_kernel(const Acc<T>* __restrict__ part, T* __restrict__ out, int64_t chunks, int64_t cols) {
  using A = Acc<T>;
  __shared__ A s[kSumRows][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t tile = blockIdx.x; tile * 32 < cols; tile += gridDim.x) {
    const int64_t j = tile * 32 + tx;
    A acc = 0;
    if (j < cols) {
      for (int64_t c = ty; c < chunks; c += kSumRows) acc += part[c * cols + j];
    }
    s[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && j < cols) {
      A t = 0;
      for (int y = 0; y < kSumRows; ++y) t += s[y][tx];
      out[j] = rows::from_acc<T>(t);
    }
    __syncthreads();
  }
}

void check_norm(const char* op, int64_t n_rows, int64_t cols) {
  if (n_rows < 0 || cols < 0)
    throw_value_error(std::string(op) + ": negative size (got rows=" + std::to_string(n_rows) +
                      ", cols=" + std::to_string(cols) + "; expected >= 0)");
  if (n_rows > 0 && cols == 0)
    throw_value_error(std::string(op) + ": cannot normalize rows of length 0 (got rows=" + std::to_string(n_rows) +
                      ", cols=0)");
}

// 16-byte vectors when every row of every row-strided buffer and the parameters start on a
// 16-byte boundary.
template <typename T>
bool can_vectorize(int64_t cols, std::initializer_list<const void*> ptrs) {
  if (cols % rows::kVec<T> != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !rows::aligned16(p)) return false;
  return true;
}

template <typename T>
void forward_impl(const void* x, const void* w, const void* b, void* y, void* mean, void* rstd, int64_t n_rows,
                  int64_t cols, double eps, bool centered, cudaStream_t stream) {
  using A = Acc<T>;
  if (n_rows == 0) return;
  const bool vec = can_vectorize<T>(cols, {x, w, b, y});
  const int64_t units = vec ? cols / rows::kVec<T> : cols;
  const int threads = rows::block_threads(units, 512);
  const unsigned blocks = rows::row_blocks(n_rows);
  auto args = [&](auto kernel) {
    kernel<<<blocks, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                                           static_cast<T*>(y), static_cast<A*>(mean), static_cast<A*>(rstd), n_rows,
                                           cols, static_cast<A>(eps), centered);
  };
  if (vec) {
    args(norm_forward_kernel<T, rows::kVec<T>>);
  } else {
    args(norm_forward_kernel<T, 1>);
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

struct Chunking {
  int64_t chunks = 0, rows_per_chunk = 0;
};

Chunking chunking(int64_t n_rows, int64_t cols, size_t acc_size, int accumulators) {
  Chunking ch;
  if (n_rows <= 0) return ch;
  int64_t target = n_rows < kMaxChunks ? n_rows : kMaxChunks;
  if (accumulators > 0) {
    const size_t per_chunk = static_cast<size_t>(cols) * acc_size * static_cast<size_t>(accumulators);
    const int64_t budget = static_cast<int64_t>(kPartialBudget / (per_chunk > 0 ? per_chunk : 1));
    if (budget < target) target = budget < 1 ? 1 : budget;
  }
  ch.rows_per_chunk = (n_rows + target - 1) / target;
  ch.chunks = (n_rows + ch.rows_per_chunk - 1) / ch.rows_per_chunk;
  return ch;
}

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t partial_bytes(const Chunking& ch, int64_t cols, size_t acc_size) {
  return round_up_256(static_cast<size_t>(ch.chunks) * static_cast<size_t>(cols) * acc_size);
}

template <typename T>
void backward_impl(const void* x, const void* w, const void* mean, const void* rstd, const void* dy, void* dx, void* dw,
                   void* db, int64_t n_rows, int64_t cols, bool centered, void* scratch, size_t scratch_bytes,
                   cudaStream_t stream, const char* op) {
  using A = Acc<T>;
  if (cols == 0) return;  // n_rows == 0 too (checked): nothing to write
  const bool want_dw = dw != nullptr, want_db = db != nullptr && centered;
  const int accumulators = (want_dw ? 1 : 0) + (want_db ? 1 : 0);
  const Chunking ch = chunking(n_rows, cols, sizeof(A), accumulators);
  const size_t part = accumulators > 0 ? partial_bytes(ch, cols, sizeof(A)) : 0;
  const size_t need = part * static_cast<size_t>(accumulators);
  if (need > 0 && (scratch == nullptr || scratch_bytes < need))
    throw_value_error(std::string(op) + ": scratch of " + std::to_string(scratch_bytes) + " bytes is too small (" +
                      std::to_string(need) + " needed)");
  A* dw_part = want_dw ? static_cast<A*>(scratch) : nullptr;
  A* db_part = want_db ? reinterpret_cast<A*>(static_cast<unsigned char*>(scratch) + (want_dw ? part : 0)) : nullptr;

  const bool vec = can_vectorize<T>(cols, {x, w, dy, dx});
  const int64_t lane_vectors = vec ? (cols / rows::kVec<T> + 31) / 32 : kMaxLaneVectors + 1;
  if (n_rows > 0 && lane_vectors <= kMaxLaneVectors && sizeof(T) <= 4) {
    // Rows short enough for a warp each (see norm_backward_warp_kernel).
    const size_t shared = 2 * static_cast<size_t>(cols) * sizeof(A);
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(ch.chunks), kRowWarps * 32, shared, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const A*>(mean), static_cast<const A*>(rstd),
          static_cast<const T*>(dy), static_cast<T*>(dx), dw_part, db_part, n_rows, cols, ch.rows_per_chunk, centered);
    };
    constexpr int V = rows::kVec<T>;
    if constexpr (sizeof(T) > 4) {
      // float64 keeps the block kernel (its rows are short here and it is no hot path).
    } else if (lane_vectors == 1) {
      launch(norm_backward_warp_kernel<T, V, 1>);
    } else if (lane_vectors == 2) {
      launch(norm_backward_warp_kernel<T, V, 2>);
    } else if (lane_vectors == 3) {
      launch(norm_backward_warp_kernel<T, V, 3>);
    } else {
      launch(norm_backward_warp_kernel<T, V, 4>);
    }
    TESSERA_CUDA_CHECK(cudaGetLastError());
  } else if (n_rows > 0) {
    const int64_t units = vec ? cols / rows::kVec<T> : cols;
    const int threads = rows::block_threads(units, 512);
    const size_t acc_bytes = static_cast<size_t>(cols) * sizeof(A) * static_cast<size_t>(accumulators);
    const bool shared_acc = accumulators > 0 && acc_bytes <= kSharedAccBytes;
    const size_t shared = shared_acc ? acc_bytes : 0;
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(ch.chunks), threads, shared, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const A*>(mean), static_cast<const A*>(rstd),
          static_cast<const T*>(dy), static_cast<T*>(dx), dw_part, db_part, n_rows, cols, ch.rows_per_chunk, centered,
          shared_acc);
    };
    if (vec) {
      launch(norm_backward_kernel<T, rows::kVec<T>>);
    } else {
      launch(norm_backward_kernel<T, 1>);
    }
    TESSERA_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t tiles = (cols + 31) / 32;
  const unsigned blocks = static_cast<unsigned>(tiles < 65535 ? tiles : 65535);
  const dim3 block(32, kSumRows);
  if (want_dw) {
    column_sum_kernel<T><<<blocks, block, 0, stream>>>(dw_part, static_cast<T*>(dw), ch.chunks, cols);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  }
  if (want_db) {
    column_sum_kernel<T><<<blocks, block, 0, stream>>>(db_part, static_cast<T*>(db), ch.chunks, cols);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  }
}

void check_stat(const char* op, int64_t n_rows, const void* stat) {
  if (n_rows > 0 && stat == nullptr) throw_value_error(std::string(op) + ": the saved statistics buffer is null");
}

}  // namespace

void layer_norm_forward(DType dtype, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                        int64_t n_rows, int64_t cols, double eps, cudaStream_t stream) {
  check_norm("layer_norm", n_rows, cols);
  rows::dispatch_float(dtype, "layer_norm", [&](auto tag) {
    forward_impl<decltype(tag)>(x, w, b, y, mean, rstd, n_rows, cols, eps, true, stream);
  });
}

void rms_norm_forward(DType dtype, const void* x, const void* w, void* y, void* rstd, int64_t n_rows, int64_t cols,
                      double eps, cudaStream_t stream) {
  check_norm("rms_norm", n_rows, cols);
  rows::dispatch_float(dtype, "rms_norm", [&](auto tag) {
    forward_impl<decltype(tag)>(x, w, nullptr, y, nullptr, rstd, n_rows, cols, eps, false, stream);
  });
}

size_t norm_backward_scratch_bytes(DType dtype, int64_t n_rows, int64_t cols, bool want_dw, bool want_db) {
  const int accumulators = (want_dw ? 1 : 0) + (want_db ? 1 : 0);
  if (accumulators == 0 || n_rows <= 0 || cols <= 0) return 0;
  const size_t acc_size = dtype == DType::Float64 ? 8 : 4;
  const Chunking ch = chunking(n_rows, cols, acc_size, accumulators);
  return partial_bytes(ch, cols, acc_size) * static_cast<size_t>(accumulators);
}

void layer_norm_backward(DType dtype, const void* x, const void* w, const void* mean, const void* rstd, const void* dy,
                         void* dx, void* dw, void* db, int64_t n_rows, int64_t cols, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream) {
  check_norm("layer_norm_backward", n_rows, cols);
  check_stat("layer_norm_backward", n_rows, mean);
  check_stat("layer_norm_backward", n_rows, rstd);
  rows::dispatch_float(dtype, "layer_norm_backward", [&](auto tag) {
    backward_impl<decltype(tag)>(x, w, mean, rstd, dy, dx, dw, db, n_rows, cols, true, scratch, scratch_bytes, stream,
                                 "layer_norm_backward");
  });
}

void rms_norm_backward(DType dtype, const void* x, const void* w, const void* rstd, const void* dy, void* dx, void* dw,
                       int64_t n_rows, int64_t cols, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  check_norm("rms_norm_backward", n_rows, cols);
  check_stat("rms_norm_backward", n_rows, rstd);
  rows::dispatch_float(dtype, "rms_norm_backward", [&](auto tag) {
    backward_impl<decltype(tag)>(x, w, nullptr, rstd, dy, dx, dw, nullptr, n_rows, cols, false, scratch, scratch_bytes,
                                 stream, "rms_norm_backward");
  });
}

}  // namespace tessera::cuda
