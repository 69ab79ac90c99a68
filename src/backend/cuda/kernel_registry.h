// The CUDA backend's kernel table: primitive name -> the function that launches its
// kernels on a stream. The GPU executable looks every node of a compiled program up
// here when it is built, so a program with an op that has no CUDA kernel is an error
// at compile time that names the op, never a wrong answer at run time.
//
// A kernel function receives the primitive (cast it to its class in
// ir/primitives/<family>.h for attributes), its inputs and outputs as device tensors
// (dense, row-major, already allocated; an output may share its input's buffer
// where Primitive::can_write_in_place allows it) and the launch context. It must only
// queue work on ctx.stream: no host synchronization, no cudaMalloc (scratch comes from
// ctx.scratch), so a whole step can be captured as a CUDA graph.
//
// Families register themselves from backend/cuda/eval_<family>.cpp through the
// register_<family>_kernels functions below (explicit calls, not static
// initializers, which a static library would drop), each checked against the
// primitive table (ir/primitive_table.h) as it registers.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/core/array.h"  // Primitive's inline members need the complete Array
#include "tessera/ir/primitive.h"

typedef struct cublasLtContext* cublasLtHandle_t;

namespace tessera::cuda {

struct DeviceTensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::Float32;

  int64_t numel() const { return tessera::numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

class KernelContext {
 public:
  cudaStream_t stream = nullptr;
  int device = 0;
  int sm_major = 0;  // compute capability of the device (kernels choose paths by it)
  int sm_minor = 0;
  int multiprocessors = 0;
  cublasLtHandle_t cublaslt = nullptr;
  // Device scratch of at least `bytes`, 256-byte aligned, valid for the current
  // kernel's work on `stream` (the next kernel may reuse it). Never allocates while a
  // CUDA graph is being captured: the executable sizes it on its first run.
  std::function<void*(size_t bytes)> scratch;
};

using KernelFn = std::function<void(const Primitive& primitive, const std::vector<DeviceTensor>& inputs,
                                    const std::vector<DeviceTensor>& outputs, KernelContext& ctx)>;

// A run of consecutive applications of one op with equivalent primitives, launched
// together (e.g. AdamW over every parameter in one multi-tensor launch). Entry i of
// `inputs` / `outputs` is application i's.
using GroupKernelFn =
    std::function<void(const Primitive& primitive, const std::vector<std::vector<DeviceTensor>>& inputs,
                       const std::vector<std::vector<DeviceTensor>>& outputs, KernelContext& ctx)>;

// Registers `fn` for primitives named `op` (replacing an earlier one). Inside
// register_builtin_kernels the name is checked against the primitive table for the
// family being registered; outside it (extensions, tests) any name is accepted.
// capturable = false: the kernel does host work at every call that a CUDA graph replay
// would skip (the collectives' rendezvous), so a program with it is never captured.
void register_kernel(std::string_view op, KernelFn fn, bool capturable = true);
bool kernel_capturable(std::string_view op);
// The kernel for `op`, or nullptr when there is none.
const KernelFn* find_kernel(std::string_view op);
// Optional: a kernel for runs of `op` (the executable groups consecutive equivalent
// applications whose non-per-tensor inputs, from `shared_inputs_from` on, are the same values).
void register_group_kernel(std::string_view op, GroupKernelFn fn, int shared_inputs_from);
const GroupKernelFn* find_group_kernel(std::string_view op, int* shared_inputs_from);
// Names of every op with a kernel, sorted (error messages, docs). The primitives that
// deliberately have none, with the reason, are the primitive table's rows with
// no_cuda_kernel (the op-coverage test fails for a primitive with neither).
std::vector<std::string> kernel_names();

// The primitive as its class (ir/primitives/<family>.h); an Error naming `op` when a
// kernel was registered under the wrong name.
template <typename P>
const P& primitive_as(const Primitive& primitive, const char* op) {
  const P* p = dynamic_cast<const P*>(&primitive);
  if (p == nullptr) fail<Error>("{}: kernel called with primitive '{}'", op, primitive.name());
  return *p;
}

// The kernel of a custom op with CUDA source (core/custom_op.h; custom_op_kernel.cpp), or
// nullptr when `op` is none. find_kernel falls back to it.
const KernelFn* custom_op_kernel(std::string_view op);

// Every family below, each under its OpFamily (runtime.cpp calls it once).
void register_builtin_kernels();

// One per family file (backend/cuda/eval_<family>.cpp).
void register_elementwise_kernels();  // unary, binary, convert, where, fusion (NVRTC)
void register_layout_kernels();       // transpose, broadcast_to, slice, pad, concatenate, copy
void register_reduce_kernels();       // reduce_sum / reduce_max / ...
void register_linalg_kernels();       // matmul, matmul_epilogue (cuBLASLt)
void register_nn_kernels();           // norms, softmax, cross-entropy
void register_attention_kernels();    // flash attention forward and backward
void register_indexing_kernels();     // take (embedding), scatter_add, take_along_axis
void register_optim_kernels();        // adamw_update, lion_update
void register_random_kernels();       // Philox bits / uniform / normal / dropout
void register_collective_kernels();   // all_gather, all_reduce, ... (SPMD programs; eval_collective.cpp)

}  // namespace tessera::cuda
