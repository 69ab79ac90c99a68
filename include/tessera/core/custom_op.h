// Custom ops: an operation defined in user code that the whole stack treats like a
// built-in primitive — grad, vmap, jit, SPMD partitioning, the persistent compilation
// cache and (with CUDA source) the GPU executable. docs/custom_kernels.md is the guide.
//
// A definition names the op and gives its rules as functions:
//   infer        input shapes/dtypes + attributes -> output shapes/dtypes (required;
//                called at trace time, so it is where bad inputs are refused)
//   cpu_kernel   raw buffers in, raw buffers out (required)
//   cuda         optional CUDA C++ source, compiled at run time with NVRTC
//   vjp          optional; written with ops (or other custom ops), so grad of grad works
//   vmap         optional; the default runs the op once per example and stacks
//   sharding     "unsharded only" (the default: SPMD gathers the inputs and every device
//                computes the whole op) or einsum-like factors naming the dims that
//                split freely
//   cost         optional FLOPs/bytes (the default counts one FLOP per output element)
//
// The IR spells a custom op as its registered name with its attributes printed in key
// order, so the compilation cache stores programs that use it by name: a process that
// registers the same name reuses the entry, and one that has not registered it treats
// the entry as a miss (with a warning naming the op), never as a crash.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/shape.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitive.h"

namespace tessera {

// An attribute value. Strings may not contain , ( ) [ ] { } " \ or control characters
// (the IR text has no escapes); doubles round-trip exactly through the text.
using CustomAttribute = std::variant<int64_t, double, std::string>;
// Sorted by key, which makes the printed form (and so the cache key) deterministic.
using CustomAttributes = std::map<std::string, CustomAttribute>;

// Typed reads with errors that name the op and the key.
int64_t attribute_int(const CustomAttributes& attributes, const std::string& key, const std::string& op);
double attribute_double(const CustomAttributes& attributes, const std::string& key, const std::string& op);
const std::string& attribute_string(const CustomAttributes& attributes, const std::string& key, const std::string& op);

struct TensorSpec {
  Shape shape;
  DType dtype = DType::Float32;
  bool operator==(const TensorSpec&) const = default;
};

// A dense row-major buffer handed to a CPU kernel. `Data` is const void for inputs.
template <typename Data>
struct KernelBuffer {
  Data* data = nullptr;
  Shape shape;
  DType dtype = DType::Float32;

  int64_t numel() const { return tessera::numel(shape); }
  // The data as T; a DTypeError when T is not the buffer's dtype.
  template <typename T>
  auto as() const {
    if (dtype_v<std::remove_const_t<T>> != dtype)
      fail<DTypeError>("custom kernel: buffer of {} read as {}", name(dtype), name(dtype_v<std::remove_const_t<T>>));
    if constexpr (std::is_const_v<Data>) {
      return static_cast<const std::remove_const_t<T>*>(data);
    } else {
      return static_cast<T*>(data);
    }
  }
};
using InputBuffer = KernelBuffer<const void>;
using OutputBuffer = KernelBuffer<void>;

// How to launch the CUDA kernel for given shapes. The kernel's parameters are, in
// order: one pointer per input (const T*), one per output (T*), then `scalars` as
// `long long` each.
struct CudaLaunch {
  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{1, 1, 1};
  size_t shared_bytes = 0;
  std::vector<int64_t> scalars;
};

struct CustomCudaKernel {
  std::string source;       // CUDA C++; `kernel_name` must be extern "C" __global__
  std::string kernel_name;  // the function to launch
  std::function<CudaLaunch(const std::vector<TensorSpec>& inputs, const std::vector<TensorSpec>& outputs,
                           const CustomAttributes& attributes)>
      launch;
};

// How the op partitions under SPMD.
struct CustomSharding {
  // Every device computes the whole op on gathered (replicated) inputs; the outputs are
  // replicated. Always correct; costs the gathers.
  static CustomSharding unsharded_only() { return {}; }
  // `spec` names one factor per dim, einsum-like: "b h q d, b h k d -> b h q d" (one
  // comma-separated group per input, one per output after "->"; "_" for a dim with no
  // name). A dim whose factor is in `shardable` may stay split across devices: the op
  // must compute each slice of it independently (a batch or head dim). All other dims
  // are gathered before the op runs. The op sees local shapes on each device, so its
  // infer and kernel must not depend on the global size of a shardable dim.
  static CustomSharding factors(std::string spec, std::vector<std::string> shardable) {
    CustomSharding s;
    s.spec = std::move(spec);
    s.shardable = std::move(shardable);
    return s;
  }
  bool is_unsharded_only() const { return spec.empty(); }

  std::string spec;
  std::vector<std::string> shardable;
};

struct CustomOpDefinition {
  // Letters, digits and '_' (starting with a letter); may not be a built-in op's name.
  std::string name;
  // How many inputs every call passes.
  int num_inputs = 1;
  // Optional: the dtype each input must have (empty: any dtypes, infer decides).
  std::vector<DType> input_dtypes;

  // Required: output shapes/dtypes. Throw ShapeError / DTypeError / ValueError naming
  // the op for inputs the op cannot take.
  std::function<std::vector<TensorSpec>(const std::vector<TensorSpec>& inputs, const CustomAttributes& attributes)>
      infer;
  // Required: computes every output (dense, row-major, allocated) from the inputs. It
  // may call parallel_for (base/thread_pool.h); under SPMD each device thread calls it.
  std::function<void(const std::vector<InputBuffer>& inputs, const std::vector<OutputBuffer>& outputs,
                     const CustomAttributes& attributes)>
      cpu_kernel;
  // Optional: a CUDA kernel compiled at run time; without it a program with this op
  // cannot run on a GPU (a compile error that names the op).
  std::optional<CustomCudaKernel> cuda;
  // Optional: input cotangents (one per input, an invalid Array for "zero") from the
  // primals, one cotangent per output (zeros where an output got none), and the
  // forward outputs. Without it grad through the op is a TransformError naming it.
  std::function<std::vector<Array>(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                   const std::vector<Array>& outputs, const CustomAttributes& attributes)>
      vjp;
  // Optional batching rule: axes[i] is input i's batch axis or -1; returns the batched
  // outputs and their batch axes. Without it vmap loops over the batch.
  std::function<std::pair<std::vector<Array>, std::vector<int>>(
      const std::vector<Array>& inputs, const std::vector<int>& axes, const CustomAttributes& attributes)>
      vmap;
  CustomSharding sharding = CustomSharding::unsharded_only();
  // Optional cost model (MFU, graph_cost).
  std::function<Cost(const std::vector<TensorSpec>& inputs, const std::vector<TensorSpec>& outputs,
                     const CustomAttributes& attributes)>
      cost;
};

// Registers the op for this process (thread-safe). Throws ValueError when the
// definition is incomplete (no infer or cpu_kernel, a bad name or sharding spec), the
// name is a built-in primitive's, or a custom op of that name is already registered.
void register_custom_op(CustomOpDefinition definition);
// Removes a registration (tests; a program holding the op keeps its definition).
// Returns whether the name was registered.
bool unregister_custom_op(const std::string& name);
// The definition registered under `name`, or null.
std::shared_ptr<const CustomOpDefinition> find_custom_op(const std::string& name);

// Applies the registered op: checks the input count and dtypes, calls infer, and
// returns lazy outputs like any op.
std::vector<Array> custom_op(const std::string& name, const std::vector<Array>& inputs,
                             const CustomAttributes& attributes = {});

// For the layers that rebuild or run custom ops (parser, cache, SPMD, CUDA): the
// primitive for a registered definition and printed attributes (ValueError for text
// it cannot read), and the definition and attributes of a primitive, null when it is
// not a custom op.
PrimitivePtr make_custom_primitive(std::shared_ptr<const CustomOpDefinition> definition,
                                   const std::string& attributes_text);
const CustomOpDefinition* custom_op_definition(const Primitive& primitive);
const CustomAttributes* custom_op_attributes(const Primitive& primitive);

// A factors spec's side ("b h q d, b h k d") as per-operand factor lists; ValueError
// naming `op` for a factor that is not a name or "_" (registration and the SPMD rule).
std::vector<std::vector<std::string>> custom_op_factor_groups(const std::string& op, const std::string& text);

}  // namespace tessera
