// gemm(): cuBLASLt descriptors, algorithm choice (heuristic + first-use timing, cached
// in gemm_algo_cache) and the fallbacks (see gemm.h).
#include "backend/cuda/kernels/gemm.h"

#include <cublasLt.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/kernels/gemm_algo_cache.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"

namespace tessera::cuda {

namespace {

thread_local GemmReport t_report;

std::mutex& options_mutex() {
  static std::mutex m;
  return m;
}

bool env_flag(const char* name, bool fallback) {
  const char* v = flags::env(name);
  if (v == nullptr || *v == '\0') return fallback;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0);
}

GemmOptions& options_storage() {
  static GemmOptions o = [] {
    GemmOptions x;
    x.autotune = env_flag("TESSERA_GEMM_AUTOTUNE", false);
    x.tf32 = env_flag("TESSERA_GEMM_TF32", false);
    x.restage = env_flag("TESSERA_GEMM_RESTAGE", true);
    return x;
  }();
  return o;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_(other)";
  }
}

void check_lt(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail<Error>("cuBLASLt error {} ({}) in {}", status_name(s), static_cast<int>(s), call);
}
#define TESSERA_LT_CHECK(call) check_lt((call), #call)

// RAII for the descriptors of one cublasLtMatmul.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulPreference_t pref = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return CUDA_R_32F;
    case DType::BFloat16:
      return CUDA_R_16BF;
    case DType::Float16:
      return CUDA_R_16F;
    case DType::Float64:
      return CUDA_R_64F;
    default:
      fail<DTypeError>("matmul: no cuBLASLt type for {}", name(dtype));
  }
}

// The largest power of two <= 256 dividing the address (and the batch stride in bytes
// when the matrix is batched), i.e. what an algorithm may assume of every entry.
int alignment_of(const void* p, int64_t batch, int64_t stride_bytes) {
  if (p == nullptr) return 0;
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (batch > 1 && stride_bytes != 0) v |= static_cast<uintptr_t>(stride_bytes);
  int al = 256;
  while (al > 1 && v % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& value, const char* what) {
  check_lt(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)), what);
}
template <typename V>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& value, const char* what) {
  check_lt(cublasLtMatrixLayoutSetAttribute(l, attr, &value, sizeof(value)), what);
}
template <typename V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const V& value,
              const char* what) {
  check_lt(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)), what);
}

// One attempt: a cuBLASLt epilogue and where the GEMM writes.
struct Plan {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool bias_fused = false;
  bool act_fused = false;
  void* aux = nullptr;  // GELU_AUX: pre-activation output
};

struct Problem {
  DType dtype;
  GemmShape s;  // after folding
  const void* a;
  const void* b;
  void* d;  // where the GEMM writes
  const void* bias;
};

// Builds the descriptors for `plan`. Returns false when the problem is outside what
// cuBLASLt's descriptors can express (then the fallback kernel runs).
bool build(const Problem& p, const Plan& plan, cublasComputeType_t compute, cudaDataType_t scale, size_t workspace,
           Descriptors& d, GemmKey& key, int sm) {
  const GemmShape& s = p.s;
  if (s.batch > std::numeric_limits<int32_t>::max()) return false;
  const cudaDataType_t t = cuda_type(p.dtype);
  const int64_t elem = static_cast<int64_t>(itemsize(p.dtype));
  TESSERA_LT_CHECK(cublasLtMatmulDescCreate(&d.op, compute, scale));
  // cuBLASLt's A is our B: column-major n x k (op N) when B is [k, n] row-major, else k x n (op T).
  const cublasOperation_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(d.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "TRANSA");
  set_desc(d.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "TRANSB");
  set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, plan.epilogue, "EPILOGUE");
  if (plan.bias_fused) set_desc(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, "BIAS_POINTER");
  if (plan.aux != nullptr) {
    set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, plan.aux, "EPILOGUE_AUX_POINTER");
    set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(s.n), "EPILOGUE_AUX_LD");
    if (s.batch > 1)
      set_desc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, static_cast<int64_t>(s.m * s.n),
               "EPILOGUE_AUX_BATCH_STRIDE");
  }
  const uint64_t a_rows = static_cast<uint64_t>(s.trans_b ? s.k : s.n);
  const uint64_t a_cols = static_cast<uint64_t>(s.trans_b ? s.n : s.k);
  const uint64_t b_rows = static_cast<uint64_t>(s.trans_a ? s.m : s.k);
  const uint64_t b_cols = static_cast<uint64_t>(s.trans_a ? s.k : s.m);
  TESSERA_LT_CHECK(cublasLtMatrixLayoutCreate(&d.a, t, a_rows, a_cols, static_cast<int64_t>(a_rows)));
  TESSERA_LT_CHECK(cublasLtMatrixLayoutCreate(&d.b, t, b_rows, b_cols, static_cast<int64_t>(b_rows)));
  TESSERA_LT_CHECK(cublasLtMatrixLayoutCreate(&d.c, t, static_cast<uint64_t>(s.n), static_cast<uint64_t>(s.m),
                                              static_cast<int64_t>(s.n)));
  if (s.batch > 1) {
    const int32_t count = static_cast<int32_t>(s.batch);
    set_layout(d.a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count, "A BATCH_COUNT");
    set_layout(d.a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, static_cast<int64_t>(s.b_batch_stride),
               "A STRIDED_BATCH_OFFSET");
    set_layout(d.b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count, "B BATCH_COUNT");
    set_layout(d.b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, static_cast<int64_t>(s.a_batch_stride),
               "B STRIDED_BATCH_OFFSET");
    set_layout(d.c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count, "C BATCH_COUNT");
    set_layout(d.c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, static_cast<int64_t>(s.m * s.n),
               "C STRIDED_BATCH_OFFSET");
  }

  key = GemmKey{};
  key.m = s.m;
  key.n = s.n;
  key.k = s.k;
  key.batch = s.batch;
  key.a_batch_stride = s.a_batch_stride;
  key.b_batch_stride = s.b_batch_stride;
  key.trans_a = s.trans_a;
  key.trans_b = s.trans_b;
  key.dtype = static_cast<int>(p.dtype);
  key.compute = static_cast<int>(compute);
  key.epilogue = static_cast<int>(plan.epilogue);
  key.align_a = alignment_of(p.a, s.batch, s.a_batch_stride * elem);
  key.align_b = alignment_of(p.b, s.batch, s.b_batch_stride * elem);
  key.align_c = alignment_of(p.d, s.batch, s.m * s.n * elem);
  key.align_bias = plan.bias_fused ? alignment_of(p.bias, 1, 0) : 0;
  key.align_aux = plan.aux != nullptr ? alignment_of(plan.aux, s.batch, s.m * s.n * elem) : 0;
  key.sm = sm;
  key.library = static_cast<int64_t>(cublasLtGetVersion());

  TESSERA_LT_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace), "MAX_WORKSPACE_BYTES");
  // cuBLASLt's A/B are our B/A.
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_b), "MIN_ALIGNMENT_A");
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_a), "MIN_ALIGNMENT_B");
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_c), "MIN_ALIGNMENT_C");
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_c), "MIN_ALIGNMENT_D");
  return true;
}

struct Scalars {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
};

cublasStatus_t run_matmul(const Problem& p, Descriptors& d, const cublasLtMatmulAlgo_t* algo, const GemmContext& ctx,
                          const Scalars& sc) {
  const bool f64 = p.dtype == DType::Float64;
  const void* alpha = f64 ? static_cast<const void*>(&sc.d1) : static_cast<const void*>(&sc.f1);
  const void* beta = f64 ? static_cast<const void*>(&sc.d0) : static_cast<const void*>(&sc.f0);
  // cuBLASLt: D = alpha * op(A') op(B') + beta * C with A' = our B, B' = our A; C = D (beta = 0).
  return cublasLtMatmul(ctx.handle, d.op, alpha, p.b, d.a, p.a, d.b, beta, p.d, d.c, p.d, d.c, algo, ctx.workspace,
                        ctx.workspace_bytes, ctx.stream);
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &status);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. the legacy stream while another stream captures
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Times `runs` calls of each candidate; returns the index of the fastest (or -1 when
// none ran) and its time.
int time_candidates(const Problem& p, Descriptors& d, const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
                    const GemmContext& ctx, const Scalars& sc, float* best_us) {
  constexpr int kRuns = 3;
  cudaEvent_t start = nullptr, stop = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  int best = -1;
  float best_ms = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < cands.size(); ++i) {
    if (run_matmul(p, d, &cands[i].algo, ctx, sc) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up
    bool ok = cudaEventRecord(start, ctx.stream) == cudaSuccess;
    for (int r = 0; r < kRuns && ok; ++r) ok = run_matmul(p, d, &cands[i].algo, ctx, sc) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(stop, ctx.stream) == cudaSuccess;
    ok = ok && cudaEventSynchronize(stop) == cudaSuccess;
    float ms = 0;
    ok = ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    if (!ok) {
      (void)cudaGetLastError();
      continue;
    }
    if (ms < best_ms) {
      best_ms = ms;
      best = static_cast<int>(i);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // An asynchronous fault in a candidate would surface here rather than later.
  TESSERA_CUDA_CHECK(cudaGetLastError());
  if (best >= 0) *best_us = best_ms * 1000.0f / kRuns;
  return best;
}

// The algorithm for the problem under `plan` (from the cache, or chosen now), or nothing
// when cuBLASLt has none.
std::optional<cublasLtMatmulAlgo_t> choose(const Problem& p, Descriptors& d, const GemmKey& key, const GemmContext& ctx,
                                           const Scalars& sc, const GemmOptions& opt, bool* tuned) {
  static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmChoice::algo), "cublasLtMatmulAlgo_t changed size");
  GemmAlgoCache& cache = gemm_algo_cache();
  if (std::optional<GemmChoice> hit = cache.find(key)) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, hit->algo.data(), sizeof(algo));
    if (hit->verified) return algo;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(ctx.handle, d.op, d.a, d.b, d.c, d.c, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
        check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= ctx.workspace_bytes) {
      hit->verified = true;  // the stored choice itself is kept unchanged (its text stays the same)
      cache.insert(key, *hit);
      return algo;
    }
    cache.erase(key);  // stale (another library build, another workspace size): choose again
  }

  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx.handle, d.op, d.a, d.b, d.c, d.c, d.pref, kCandidates, results, &returned);
  std::vector<cublasLtMatmulHeuristicResult_t> cands;
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < returned; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ctx.workspace_bytes)
        cands.push_back(results[i]);
  }
  if (cands.empty()) return std::nullopt;

  int pick = 0;
  float time_us = -1;
  if (opt.autotune && cands.size() > 1 && !capturing(ctx.stream)) {
    const int best = time_candidates(p, d, cands, ctx, sc, &time_us);
    if (best >= 0) pick = best;
    *tuned = true;
  }
  GemmChoice choice;
  std::memcpy(choice.algo.data(), &cands[pick].algo, sizeof(cublasLtMatmulAlgo_t));
  choice.workspace_bytes = cands[pick].workspaceSize;
  choice.time_us = time_us;
  choice.verified = true;
  cache.insert(key, choice);
  return cands[pick].algo;
}

// Problems cuBLASLt has no algorithm for, so the heuristic is not asked again each call.
struct NoAlgo {
  std::mutex mutex;
  std::set<GemmKey> keys;
  bool contains(const GemmKey& k) {
    std::lock_guard<std::mutex> lock(mutex);
    return keys.count(k) != 0;
  }
  void add(const GemmKey& k) {
    std::lock_guard<std::mutex> lock(mutex);
    keys.insert(k);
  }
};
NoAlgo& no_algo() {
  static NoAlgo n;
  return n;
}

bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

// Folds a batched A with a shared B into one GEMM with batch * m rows.
GemmShape fold(const GemmShape& in, bool* folded) {
  GemmShape s = in;
  *folded = false;
  if (s.batch > 1 && !s.trans_a && s.a_batch_stride == s.m * s.k && s.b_batch_stride == 0) {
    s.m *= s.batch;
    s.batch = 1;
    s.a_batch_stride = 0;
    *folded = true;
  }
  if (s.batch == 1) {
    s.a_batch_stride = 0;
    s.b_batch_stride = 0;
  }
  return s;
}

void validate(DType dtype, const GemmShape& s, const void* a, const void* b, const void* c, const GemmEpilogue& e) {
  if (s.batch < 0 || s.m < 0 || s.n < 0 || s.k < 0 || s.a_batch_stride < 0 || s.b_batch_stride < 0)
    fail<ValueError>("matmul: negative size (got batch={}, m={}, n={}, k={}, strides {} and {}; expected >= 0)",
                     s.batch, s.m, s.n, s.k, s.a_batch_stride, s.b_batch_stride);
  if (e.pre_activation != nullptr && e.activation == GemmActivation::None)
    fail<ValueError>("matmul_epilogue: a pre-activation output needs an activation");
  if (!is_floating(dtype) && e.activation != GemmActivation::None && e.activation != GemmActivation::Relu)
    fail<DTypeError>("matmul_epilogue: an integer product takes only relu as its activation (got {})", name(dtype));
  if (dtype == DType::Bool) fail<DTypeError>("matmul: bool operands are not supported (cast to a numeric dtype)");
  const bool empty = s.batch == 0 || s.m == 0 || s.n == 0;
  if (!empty && (c == nullptr || (s.k > 0 && (a == nullptr || b == nullptr))))
    fail<ValueError>("matmul: null device buffer for a non-empty product");
}

// Restaging (gemm.h): the zero-padded shape and which matrices it changes.
struct Staging {
  GemmShape padded;
  bool a = false, b = false, c = false;
  size_t bytes_a = 0, bytes_b = 0, bytes_c = 0;  // each rounded up to 256
  size_t total() const { return bytes_a + bytes_b + bytes_c; }
};

Staging staging_of(DType dtype, const GemmShape& s, bool epilogue) {
  Staging st;
  if (!is_half(dtype) || epilogue || s.batch != 1 || s.m == 0 || s.n == 0 || s.k == 0) return st;
  const int64_t per = 16 / static_cast<int64_t>(itemsize(dtype));
  auto pad = [per](int64_t x) { return (x + per - 1) / per * per; };
  // Dimensions that are some matrix's row length: A's (m if trans_a, else k), B's (k if
  // trans_b, else n), C's (n).
  const bool pad_m = s.trans_a && s.m % per != 0;
  const bool pad_k = s.k % per != 0 && (!s.trans_a || s.trans_b);
  const bool pad_n = s.n % per != 0;
  if (!pad_m && !pad_k && !pad_n) return st;
  st.padded = s;
  st.padded.m = pad_m ? pad(s.m) : s.m;
  st.padded.k = pad_k ? pad(s.k) : s.k;
  st.padded.n = pad_n ? pad(s.n) : s.n;
  st.a = pad_m || pad_k;
  st.b = pad_k || pad_n;
  st.c = pad_m || pad_n;
  const size_t elem = itemsize(dtype);
  auto bytes = [elem](int64_t x, int64_t y) { return (static_cast<size_t>(x * y) * elem + 255) / 256 * 256; };
  const GemmShape& p = st.padded;
  st.bytes_a = st.a ? bytes(p.m, p.k) : 0;
  st.bytes_b = st.b ? bytes(p.k, p.n) : 0;
  st.bytes_c = st.c ? bytes(p.m, p.n) : 0;
  return st;
}

// Stored rows x row length of A, B, C for shape s (row-major, transposes as stored).
struct Stored {
  int64_t rows, row;
};
Stored stored_a(const GemmShape& s) { return s.trans_a ? Stored{s.k, s.m} : Stored{s.m, s.k}; }
Stored stored_b(const GemmShape& s) { return s.trans_b ? Stored{s.n, s.k} : Stored{s.k, s.n}; }

// dst = src zero-padded from `from` to `to` (dense both).
void pad_into(void* dst, Stored to, const void* src, Stored from, cudaStream_t stream) {
  detail::launch_pad_copy16(dst, to.rows, to.row, src, from.row, from.rows, from.row, stream);
}

}  // namespace

GemmOptions gemm_options() {
  std::lock_guard<std::mutex> lock(options_mutex());
  return options_storage();
}

void set_gemm_options(const GemmOptions& options) {
  std::lock_guard<std::mutex> lock(options_mutex());
  options_storage() = options;
}

GemmReport last_gemm_report() { return t_report; }

size_t gemm_staging_bytes(DType dtype, const GemmShape& shape) {
  if (gemm_options().reference_only || !gemm_options().restage) return 0;
  bool folded = false;
  // The output is restaged only without an epilogue: size for that, the larger.
  return staging_of(dtype, fold(shape, &folded), false).total();
}

// One cuBLASLt attempt at `plan`: Ran, NoAlgorithm (none, known from before or found now:
// another plan may have one), or Inexpressible (beyond what the descriptors express).
enum class Attempt { Ran, NoAlgorithm, Inexpressible };
Attempt try_plan(const Problem& p, const Plan& plan, cublasComputeType_t compute, cudaDataType_t scale,
                 const GemmContext& ctx, const GemmOptions& opt, bool* tuned) {
  Descriptors d;
  GemmKey key;
  if (!build(p, plan, compute, scale, ctx.workspace_bytes, d, key, ctx.sm_major * 10 + ctx.sm_minor))
    return Attempt::Inexpressible;
  if (no_algo().contains(key)) return Attempt::NoAlgorithm;
  const Scalars scalars;
  bool timed = false;
  std::optional<cublasLtMatmulAlgo_t> algo = choose(p, d, key, ctx, scalars, opt, &timed);
  *tuned = *tuned || timed;
  if (!algo) {
    no_algo().add(key);
    return Attempt::NoAlgorithm;
  }
  const cublasStatus_t st = run_matmul(p, d, &*algo, ctx, scalars);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    gemm_algo_cache().erase(key);
    no_algo().add(key);
    return Attempt::NoAlgorithm;
  }
  check_lt(st, "cublasLtMatmul");
  TESSERA_CUDA_CHECK(cudaGetLastError());
  return Attempt::Ran;
}

void gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c, const GemmEpilogue& epilogue,
          const GemmContext& ctx) {
  validate(dtype, shape, a, b, c, epilogue);
  GemmReport& report = t_report;
  report = GemmReport{};
  if (shape.batch == 0 || shape.m == 0 || shape.n == 0) return;
  const GemmOptions opt = gemm_options();
  bool folded = false;
  const GemmShape s = fold(shape, &folded);
  report.folded = folded;
  const int64_t out_rows = s.batch * s.m;
  const size_t out_bytes = static_cast<size_t>(out_rows) * static_cast<size_t>(s.n) * itemsize(dtype);
  const GemmActivation act = epilogue.activation;
  void* pre = epilogue.pre_activation;
  const bool has_epilogue = epilogue.bias != nullptr || act != GemmActivation::None;

  if (s.k == 0) {  // an empty sum: zeros (every float format's zero is all-zero bits)
    report.path = GemmPath::ZeroK;
    TESSERA_CUDA_CHECK(cudaMemsetAsync(c, 0, out_bytes, ctx.stream));
    if (has_epilogue) {
      detail::launch_gemm_epilogue(dtype, c, epilogue.bias, pre, c, out_rows, s.n, act, ctx.stream);
      report.post_kernel = true;
    }
    return;
  }

  // Where the GEMM writes when the activation runs afterwards: the pre-activation
  // buffer (the epilogue kernel then reads it and writes c), else c itself.
  void* unfused_target = pre != nullptr ? pre : c;
  auto post = [&](bool bias_done, bool act_done) {
    const void* bias = bias_done ? nullptr : epilogue.bias;
    const GemmActivation a2 = act_done ? GemmActivation::None : act;
    if (bias == nullptr && a2 == GemmActivation::None) return;
    // pre may be unfused_target itself: each element is read before it is written.
    detail::launch_gemm_epilogue(dtype, unfused_target, bias, pre, c, out_rows, s.n, a2, ctx.stream);
    report.post_kernel = true;
  };
  auto reference = [&]() {
    report.path = GemmPath::Reference;
    detail::launch_reference_gemm(dtype, s, a, b, has_epilogue ? unfused_target : c, ctx.stream);
    post(false, false);
  };

  if (!is_floating(dtype) || opt.reference_only || ctx.handle == nullptr) {
    reference();
    return;
  }

  const bool bias = epilogue.bias != nullptr;
  std::vector<Plan> plans;
  {
    Plan fused;
    fused.bias_fused = bias;
    fused.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (act == GemmActivation::Relu && pre == nullptr) {
      fused.epilogue = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
      fused.act_fused = true;
    } else if (act == GemmActivation::GeluTanh && is_half(dtype)) {
      if (pre == nullptr) {
        fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
        fused.act_fused = true;
      } else if (s.n % 8 == 0 && reinterpret_cast<uintptr_t>(pre) % 16 == 0) {
        fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        fused.act_fused = true;
        fused.aux = pre;
      }
    }
    plans.push_back(fused);
    if (fused.epilogue != CUBLASLT_EPILOGUE_DEFAULT) plans.push_back(Plan{});  // everything in the epilogue kernel
  }

  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  if (dtype == DType::Float64) {
    compute = CUBLAS_COMPUTE_64F;
    scale = CUDA_R_64F;
  } else if (dtype == DType::Float32 && opt.tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }

  // Dimensions with misaligned 16-bit rows: zero-pad them in staging memory (gemm.h).
  Staging stg = staging_of(dtype, s, has_epilogue);
  if (stg.total() == 0 || ctx.staging == nullptr || ctx.staging_bytes < stg.total()) stg = Staging{};
  unsigned char* stage = static_cast<unsigned char*>(ctx.staging);
  const void* a_in = a;
  const void* b_in = b;
  void* c_out = nullptr;
  if (stg.a) {
    pad_into(stage, stored_a(stg.padded), a, stored_a(s), ctx.stream);
    a_in = stage;
    stage += stg.bytes_a;
  }
  if (stg.b) {
    pad_into(stage, stored_b(stg.padded), b, stored_b(s), ctx.stream);
    b_in = stage;
    stage += stg.bytes_b;
  }
  if (stg.c) c_out = stage;
  report.staged = (stg.a ? 1 : 0) | (stg.b ? 2 : 0) | (stg.c ? 4 : 0);
  const GemmShape& gs = report.staged != 0 ? stg.padded : s;

  for (const Plan& plan : plans) {
    Problem p{dtype, gs, a_in, b_in, plan.act_fused ? c : (has_epilogue ? unfused_target : c), epilogue.bias};
    if (stg.c) p.d = c_out;
    const Attempt attempt = try_plan(p, plan, compute, scale, ctx, opt, &report.tuned);
    if (attempt == Attempt::Inexpressible) break;
    if (attempt == Attempt::NoAlgorithm) continue;
    report.path = GemmPath::CublasLt;
    report.lt_epilogue = static_cast<int>(plan.epilogue);
    if (stg.c)  // the top-left m x n corner
      detail::launch_pad_copy16(c, s.m, s.n, c_out, stg.padded.n, s.m, s.n, ctx.stream);
    post(plan.bias_fused, plan.act_fused);
    return;
  }
  report.staged = 0;
  reference();
}

bool gemm_dgelu(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c, const void* x,
                const GemmContext& ctx) {
  validate(dtype, shape, a, b, c, GemmEpilogue{});
  const GemmOptions opt = gemm_options();
  if (!is_half(dtype) || ctx.handle == nullptr || opt.reference_only || shape.batch == 0 || shape.m == 0 ||
      shape.n == 0 || shape.k == 0 || shape.n % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(c) % 16 != 0)
    return false;
  bool folded = false;
  const GemmShape s = fold(shape, &folded);
  if (staging_of(dtype, s, false).total() != 0) return false;  // misaligned rows: the plain path restages
  Plan plan;
  plan.epilogue = CUBLASLT_EPILOGUE_DGELU;
  plan.act_fused = true;
  plan.aux = const_cast<void*>(x);  // read, not written, by DGELU
  bool tuned = false;
  if (try_plan(Problem{dtype, s, a, b, c, nullptr}, plan, CUBLAS_COMPUTE_32F, CUDA_R_32F, ctx, opt, &tuned) !=
      Attempt::Ran)
    return false;
  GemmReport& report = t_report;
  report = GemmReport{};
  report.tuned = tuned;
  report.path = GemmPath::CublasLt;
  report.lt_epilogue = static_cast<int>(plan.epilogue);
  report.folded = folded;
  return true;
}

}  // namespace tessera::cuda
