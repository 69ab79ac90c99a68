// Primitive: the definition of one operation in the graph. An op function in
// core/ops.h validates its arguments, promotes dtypes, computes the output shape and
// returns lazy Arrays holding a Primitive; the primitive owns everything else the
// stack needs to know about the operation:
//   * eval_cpu      - the CPU kernel call (src/backend/cpu/eval_<family>.cpp)
//   * vjp           - reverse-mode rule, written with ops so it is itself differentiable
//   * vmap          - batching rule
//   * cost          - FLOPs and bytes moved (MFU, cost model)
//   * sharding_rule_key - the key of its placement rule in the SPMD layer (spmd/)
//   * composite     - optional: the same math written with simpler ops; fused
//                     primitives use it for the rules their kernels do not cover
//                     (higher-order gradients, unusual cotangents).
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

class Array;

// What one evaluation of a primitive costs. Bytes count reads of every input and
// writes of every output once (the traffic a fused, cache-friendly kernel needs).
struct Cost {
  double flops = 0;
  double bytes = 0;
};

class Primitive {
 public:
  virtual ~Primitive() = default;

  // Lower-case op name as printed in the IR ("add", "matmul", "softmax").
  virtual std::string name() const = 0;
  // Attributes as printed in the IR text after the operands, e.g. "axes=[0, 1]".
  // Two primitives with the same name and attributes compute the same function.
  virtual std::string attributes() const { return {}; }

  // Computes `outputs` (shape and dtype set, no storage yet) from evaluated inputs.
  // Must allocate each output (Array::allocate or Array::share_storage).
  virtual void eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) = 0;

  // Cotangents of the inputs listed in `argnums`, given one cotangent per output
  // (same shape and dtype as the output). The default uses composite() when the
  // primitive has one, and otherwise throws TransformError naming the op.
  virtual std::vector<Array> vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents,
                                 const std::vector<int>& argnums, const std::vector<Array>& outputs);

  // Batching rule: `axes[i]` is the batch axis of inputs[i], or -1 if it is not
  // batched. Returns the batched outputs and their batch axes. The default loops
  // over the batch (correct for every primitive; fused primitives override it).
  virtual std::pair<std::vector<Array>, std::vector<int>> vmap(const std::vector<Array>& inputs,
                                                               const std::vector<int>& axes);

  // The same outputs written with other ops; empty when the primitive is basic.
  // Defined out of line: an inline `return {}` instantiates ~vector<Array> where Array is
  // incomplete, which clang (C++20's constexpr vector) refuses.
  virtual std::vector<Array> composite(const std::vector<Array>& inputs) const;

  virtual Cost cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const;

  // The key of this primitive's rule in the SPMD layer's rule table (spmd/: placement
  // propagation for partitioning): name() for most primitives. A primitive that
  // computes like another but partitions differently names its own rule. With no rule
  // under the key, the partitioner asks for an explicit sharding constraint instead of
  // guessing.
  virtual std::string sharding_rule_key() const { return name(); }

  // Buffer reuse for the memory planner. can_write_in_place: output `output` may be
  // written into the buffer of input `input` (when their shapes and dtypes match),
  // because the kernel reads each input element before it writes the same output
  // element and reads no other element of that input afterwards.
  virtual bool can_write_in_place(int /*input*/, int /*output*/) const { return false; }
  // The input whose buffer output `output` is a view of (reshape, identity), or -1
  // when the output has a buffer of its own. eval_cpu then calls share_storage.
  virtual int aliases_input(int /*output*/) const { return -1; }
  // Output `output` lives in host memory, not on the device that runs the program
  // (offload_to_host): the planner gives it a buffer in the host arena and leaves it
  // out of the device peak.
  virtual bool output_in_host_memory(int /*output*/) const { return false; }

  // Same function of the inputs (used by CSE and the compilation cache).
  virtual bool is_equivalent(const Primitive& other) const {
    return name() == other.name() && attributes() == other.attributes();
  }
};

using PrimitivePtr = std::shared_ptr<Primitive>;

// Declarations of the overrides most primitives have (MLX's DEFINE_GRADS idea):
// keeps the per-family headers to what differs between primitives.
#define TESSERA_PRIMITIVE_EVAL void eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) override;
#define TESSERA_PRIMITIVE_VJP                                                                     \
  std::vector<Array> vjp(const std::vector<Array>& primals, const std::vector<Array>& cotangents, \
                         const std::vector<int>& argnums, const std::vector<Array>& outputs) override;
#define TESSERA_PRIMITIVE_VMAP                                                                                         \
  std::pair<std::vector<Array>, std::vector<int>> vmap(const std::vector<Array>& inputs, const std::vector<int>& axes) \
      override;
#define TESSERA_PRIMITIVE_COMPOSITE std::vector<Array> composite(const std::vector<Array>& inputs) const override;
#define TESSERA_PRIMITIVE_COST \
  Cost cost(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const override;

}  // namespace tessera
