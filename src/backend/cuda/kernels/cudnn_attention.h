// cuDNN's fused flash attention (the cuDNN frontend's SDPA graphs, forward and backward)
// as a second implementation of the attention launchers of flash_attention.h: the same
// contract (scores, top-left causal alignment, lse as the natural-log sum of exp over
// visible keys, float32 [B, H, T]) and the same strided layouts, so that the attention
// evals can run either and a test can compare them.
//
// libcudnn.so.9 is opened at run time (dlopen; TESSERA_CUDNN_LIBRARY names another file),
// never linked: a build without the frontend (cmake/cudnn.cmake) or a machine without
// cuDNN runs tessera's own kernels, and cudnn_library() says why.
//
// Which implementation the attention evals run comes from TESSERA_ATTENTION_KERNEL (read
// on every call): "auto" (the default, also when unset) runs cuDNN where it loaded and
// applies, tessera's v2 kernels elsewhere; "cudnn" the same, but an Error naming the
// reason when cuDNN is not loaded; "v2" or "v1" always tessera's kernels
// (flash_attention_kernel()). On one H200, GPT-2 124M's step is 33.8 ms with cuDNN's
// attention and 37.2 ms with v2 (bench/results/2026-11-28c-gpu-h200.md).
//
// Where cuDNN applies: bfloat16 / float16, head_dim a multiple of 8 up to 128, no mask or
// segment ids, q heads a multiple of kv heads with each kind's heads at one stride (every
// dense layout; the packed qkv layout only when H == Hkv), 16-byte aligned pointers and
// strides, not the backward of one query and one key (cuDNN refuses it), and a graph
// cuDNN supports on this device (checked once per shape and layout; a refusal is
// remembered, printed once, and the caller falls back). The backward asks for cuDNN's
// deterministic algorithm, so two runs are bitwise equal.
//
// Graphs are built on first use (a few ms) and cached per (direction, dtype, shape,
// strides); launches after that only queue work on the stream, so a step that ran once
// eagerly can be captured in a CUDA graph. The workspace comes from the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

#include "backend/cuda/kernels/flash_attention.h"
#include "tessera/base/dtype.h"

namespace tessera::cuda {

struct CudnnLibrary {
  bool built = false;   // this build has the cuDNN path (cmake/cudnn.cmake)
  bool loaded = false;  // libcudnn opened and usable
  int version = 0;      // cudnnGetVersion(): 91900 = 9.19.0
  std::string path;     // the file opened (as found by dlopen)
  std::string reason;   // why not loaded (empty when loaded)
};
// Opens the library on the first call (thread-safe); the answer never changes after.
const CudnnLibrary& cudnn_library();
// One line for `tessera info` and the benchmarks: "9.19.0 (libcudnn.so.9)" or why not.
std::string cudnn_description();

// Whether the attention evals try cuDNN first: TESSERA_ATTENTION_KERNEL unset, "auto" or
// "cudnn" and cuDNN loaded; "cudnn" without cuDNN is an Error naming the reason.
bool cudnn_attention_selected();

// Device workspace of at least `bytes`, 256-byte aligned, valid until the launch's work
// has run on the stream (KernelContext::scratch).
using CudnnWorkspace = std::function<void*(size_t bytes)>;

// flash_attention_forward_strided / flash_attention_backward_strided on cuDNN. Return
// false, launching nothing, when cuDNN does not apply (see above); the caller then runs
// tessera's kernels. lse is float32 [B, H, T], contiguous; the backward reads the lse of
// either implementation's forward.
bool cudnn_attention_forward(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                             const void* q, const void* k, const void* v, void* out, float* lse,
                             const CudnnWorkspace& workspace, cudaStream_t stream);
bool cudnn_attention_backward(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                              const void* q, const void* k, const void* v, const void* out, const float* lse,
                              const void* dout, void* dq, void* dk, void* dv, const CudnnWorkspace& workspace,
                              cudaStream_t stream);

}  // namespace tessera::cuda
