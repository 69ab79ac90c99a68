// GEMM on the device through cuBLASLt, with a fused bias / activation epilogue:
//
//   C[b] = op(A[b]) op(B[b])            (b < batch; op = transpose or not)
//   S = C + bias   (bias [n], broadcast over rows)       when epilogue.bias
//   C = act(S); pre_activation = S                       when an activation is set
//
// Layouts are row-major: A is [m, k] ([k, m] when trans_a), B is [k, n] ([n, k] when
// trans_b), C (and pre_activation) dense [batch, m, n]. a_batch_stride / b_batch_stride
// are in elements, 0 meaning one matrix shared by every batch entry (Matmul's rank-2
// operand). Row-major C = op(A) op(B) is computed as the column-major C^T =
// op(B)^T op(A)^T, i.e. cuBLASLt's A is our B and its B our A, with no copies.
// A batched A with a shared B ([B, T, K] x [K, N], the transformer's linear layers)
// folds into one [B*T, K] x [K, N] GEMM; other batches use the strided-batch layout.
//
// dtypes: float32 (CUBLAS_COMPUTE_32F: true fp32, matching the CPU at 1e-5; TF32 only
// when opted in), bfloat16 and float16 (fp32 accumulation and scale, 16-bit storage),
// float64 (CUBLAS_COMPUTE_64F). Integer dtypes go to a simple tiled CUDA kernel with
// 64-bit wrapping accumulation, like the CPU's native loop (epilogue: bias, relu).
//
// Epilogues: bias -> CUBLASLT_EPILOGUE_BIAS; relu (without pre_activation) ->
// RELU(_BIAS). gelu_tanh in bfloat16/float16 -> GELU(_BIAS), or GELU_AUX(_BIAS), which
// also stores S, when pre_activation is wanted and n % 8 == 0 with a 16-byte aligned
// pre_activation buffer. cuBLASLt's GELU is the tanh approximation
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (cublasLt.h: "GELU point-wise
// transform"; PyTorch routes only gelu(approximate='tanh') to it), i.e. UnaryKind::GeluTanh.
// It is not used for float32/float64, where its internal tanh precision is not
// documented: those (and every other activation, and any epilogue cuBLASLt has no
// algorithm for) run the GEMM (+ bias) and then one elementwise kernel with the CPU's
// per-element formulas. When cuBLASLt has no algorithm at all for a problem, a tiled
// CUDA kernel computes it (slow, but always right).
//
// Algorithm choice: cublasLtMatmulAlgoGetHeuristic (up to 8 candidates that fit the
// workspace and the buffers' actual alignments). By default the heuristic's first is
// taken: it depends only on the problem, the GPU and the library, so two runs of the
// same config give the same bits (the project's determinism rule). With
// TESSERA_GEMM_AUTOTUNE=1 each candidate is timed on first use (one warm-up, then 3
// runs between CUDA events: the only host wait, never inside a CUDA graph capture)
// and the fastest is kept in gemm_algo_cache() (gemm_algo_cache.h); timing noise can
// then pick another algorithm in another process unless the cache is saved and
// reloaded. TESSERA_GEMM_TF32=1 allows TF32 for float32.
//
// Everything is queued on the context's stream; nothing is allocated (the workspace is
// the caller's), so a step can be captured in a CUDA graph once every GEMM has been
// tuned (the executable's first run).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/base/dtype.h"

typedef struct cublasLtContext* cublasLtHandle_t;

namespace tessera::cuda {

struct GemmShape {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;        // A stored as [k, m] when true, else [m, k]
  bool trans_b = false;        // B stored as [n, k] when true, else [k, n]
  int64_t a_batch_stride = 0;  // elements between batch entries of A; 0 = same A for every entry
  int64_t b_batch_stride = 0;
};

// Matches MatmulEpilogue's activations (kept apart from UnaryKind so this header
// depends on nothing but base/).
enum class GemmActivation : uint8_t { None, GeluTanh, GeluErf, Relu, Silu, Tanh, Sigmoid };

struct GemmEpilogue {
  const void* bias = nullptr;  // n elements of the GEMM's dtype; nullptr: no bias
  GemmActivation activation = GemmActivation::None;
  void* pre_activation = nullptr;  // [batch, m, n]: S before the activation (needs an activation)
};

struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // device memory, 256-byte aligned
  size_t workspace_bytes = 0;
  // Device memory for operands restaged with zero-padded dimensions (gemm_staging_bytes); without
  // enough of it such a GEMM runs on the unaligned data.
  void* staging = nullptr;
  size_t staging_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};

// Hopper's fast GEMM kernels need every dimension that is a row length to be a multiple
// of 8 16-bit elements: with GPT-2's 50257-token vocabulary cuBLASLt falls back to kernels
// 5-6x slower (bench_gpu_gemm on an H100: 98-154 TFLOP/s for the three logits GEMMs, 690-820
// with 50304), even when only the row stride is padded. So gemm() zero-pads such a
// dimension: the operands that have it are copied into staging memory padded with zeros
// (zero rows/columns add nothing to the product) and an output that has it is computed
// there and its top-left corner copied back. One pass over each restaged matrix: far
// cheaper than the slow GEMM. Only single (folded) 16-bit products without an epilogue.
// The bytes of staging a GEMM of this shape uses (0: none needed).
size_t gemm_staging_bytes(DType dtype, const GemmShape& shape);

// The workspace a GEMM asks for (cuBLASLt's recommendation for Hopper is 32 MiB).
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

struct GemmOptions {
  bool autotune = false;        // TESSERA_GEMM_AUTOTUNE (default 0: deterministic)
  bool tf32 = false;            // TESSERA_GEMM_TF32 (default 0)
  bool reference_only = false;  // tests: always the tiled CUDA kernel
  bool restage = true;          // TESSERA_GEMM_RESTAGE (default 1): zero-pad misaligned 16-bit dimensions
};
// Read from the environment on first use.
GemmOptions gemm_options();
void set_gemm_options(const GemmOptions& options);

// c (and epilogue.pre_activation) = the product above. Buffers must not overlap.
void gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c, const GemmEpilogue& epilogue,
          const GemmContext& context);

// The backward of a gelu_tanh epilogue: c = gelu_tanh'(x) * (the product), x of c's shape
// (the forward's pre-activation), in cuBLASLt's DGELU epilogue (x its aux input; the
// product is not rounded before the multiply). True when that ran; false, launching
// nothing, where it does not apply: not bfloat16/float16, k == 0, n not a multiple of 8,
// x or c not 16-byte aligned, dimensions that would need restaging, no cuBLASLt
// algorithm. The caller then runs gemm() and the unfused gradient kernel.
bool gemm_dgelu(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c, const void* x,
                const GemmContext& context);

// What the calling thread's last gemm() did (tests and diagnostics).
enum class GemmPath : uint8_t { Empty, ZeroK, CublasLt, Reference };
struct GemmReport {
  GemmPath path = GemmPath::Empty;
  int lt_epilogue = 0;       // cublasLtEpilogue_t used (CublasLt)
  bool post_kernel = false;  // the elementwise epilogue kernel ran
  bool folded = false;       // the batch was folded into m
  bool tuned = false;        // this call timed the candidates
  int staged = 0;            // matrices restaged with padded dimensions: 1 = A, 2 = B, 4 = C
};
GemmReport last_gemm_report();

namespace detail {
// gemm.cu. out[i] = act(S_i), S_i = s[i] (+ bias[i % n], rounded to the dtype as the
// unfused add would), pre[i] = S_i when pre is non-null; s may equal out or pre.
// rows * n elements; integer dtypes take only relu.
void launch_gemm_epilogue(DType dtype, const void* s, const void* bias, void* pre, void* out, int64_t rows, int64_t n,
                          GemmActivation activation, cudaStream_t stream);
// dst (dst_rows x dst_ld 16-bit elements, dense) = src (src_rows x src_row, row stride
// src_ld) in the top-left corner, zeros elsewhere (also a plain strided copy).
void launch_pad_copy16(void* dst, int64_t dst_rows, int64_t dst_ld, const void* src, int64_t src_ld, int64_t src_rows,
                       int64_t src_row, cudaStream_t stream);
// The tiled fallback GEMM (any float or integer dtype, no epilogue).
void launch_reference_gemm(DType dtype, const GemmShape& shape, const void* a, const void* b, void* c,
                           cudaStream_t stream);
}  // namespace detail

}  // namespace tessera::cuda
