// Fusion: a chain of elementwise ops run as one kernel (built by the compiler's
// fusion pass, after autodiff). It holds a small register program:
//
//   registers in0..in{N-1}  the inputs, each broadcast (numpy rules) to `shape`
//   t0, t1, ...             one per instruction: unary / binary / where / convert of
//                           earlier registers, computed in the dtype the unfused op
//                           would use (so the fused result is bitwise the unfused one)
//   out=[...]               the registers returned, all of shape `shape`
//
// With `reduce` set (a "fused reduction") the program has one output register, which
// is reduced (sum or max) over the trailing `reduce_axes` of `shape`, exactly as the
// Reduce primitive would reduce it.
//
// IR text (attributes() / parse_fusion):
//   shape=[4, 8], inputs=[f32[4, 8], f32[8]], body={t0 = multiply(in0, in1); t1 = exp(t0); out=[t1]}
//   ..., reduce=sum, axes=[1]
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera {

class AttributeMap;  // ir/attributes.h
namespace cpu {
class FusedKernel;
}

struct FusionInstruction {
  enum class Kind : uint8_t { Unary, Binary, Where, Convert };
  Kind kind = Kind::Unary;
  int op = 0;                    // UnaryKind / BinaryKind value
  DType dtype = DType::Float32;  // result dtype (Convert: the target)
  std::vector<int> args;         // registers: 0..N-1 inputs, N+k instruction k
};

struct FusionInput {
  Shape shape;
  DType dtype = DType::Float32;
};

struct FusionProgram {
  Shape shape;  // the elementwise domain (the outputs' shape unless reducing)
  std::vector<FusionInput> inputs;
  std::vector<FusionInstruction> body;
  std::vector<int> outputs;          // registers
  std::optional<ReduceKind> reduce;  // Sum or Max: a fused reduction
  std::vector<int> reduce_axes;      // trailing axes of `shape`, sorted

  int num_registers() const { return static_cast<int>(inputs.size() + body.size()); }
  DType register_dtype(int reg) const;
  // Appends an instruction (its result dtype is derived from the operands, like the
  // unfused op's) and returns its register. Throws DTypeError / ValueError when the
  // operands do not fit the op.
  int add_unary(UnaryKind kind, int x);
  int add_binary(BinaryKind kind, int a, int b);
  int add_where(int cond, int a, int b);
  int add_convert(int x, DType dtype);
  // Checks registers, dtypes, broadcastability and the reduce axes; throws ValueError.
  void validate() const;
  Shape output_shape() const;  // `shape` without the reduce axes
};

class Fusion : public Primitive {
 public:
  explicit Fusion(FusionProgram program);
  const FusionProgram& program() const { return program_; }
  std::string name() const override { return "fusion"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST
  // Each output tile is written only after the whole tile of every input has been
  // read (broadcast inputs are re-read across tiles, so they cannot be overwritten).
  bool can_write_in_place(int input, int output) const override;

 private:
  FusionProgram program_;
  // The program lowered for the CPU kernel with its tile plans, built on the first
  // eval_cpu (inputs always have the program's shapes), so later runs allocate nothing.
  mutable std::mutex cpu_kernel_mutex_;
  mutable std::shared_ptr<const cpu::FusedKernel> cpu_kernel_;
};

// Reads attributes() back (the primitive registry's factory for "fusion").
PrimitivePtr parse_fusion(const AttributeMap& attributes);

}  // namespace tessera
