// Fused elementwise kernel: runs a register program (see ir/primitives/fusion.h) over
// an output of `shape` in tiles of kFusedTile elements, so every intermediate lives in
// a few cache-resident tile buffers instead of full-size arrays.
//
// Per tile: inputs are read in place (contiguous, full-shape), as one broadcast element
// (scalars, for binary/where operands), or gathered through their broadcast strides
// into a tile buffer; each instruction then runs the same serial per-op code as the
// unfused kernels (unary_span, binary_span, cast_span), in the instruction's dtype, so
// results are bitwise those of the unfused ops. Outputs are written in place.
// Tiles are distributed with parallel_for in fixed chunks; elements are independent,
// so results do not depend on the thread count.
//
// Fused reduction: the single output register is reduced over the trailing `len`
// elements of each of `rows` rows, with the same blocked order as cpu::reduce (each
// row is cut into kReduceBlock blocks, 32 lanes per block, a halving tree inside a
// block and a pairwise tree across blocks).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"

namespace tessera::cpu {

inline constexpr int64_t kFusedTile = 2048;

enum class FusedOpKind : uint8_t { Unary, Binary, Where, Cast };

struct FusedInstruction {
  FusedOpKind kind = FusedOpKind::Unary;
  int op = 0;                    // cpu::UnaryOp / cpu::BinaryOp value
  DType dtype = DType::Float32;  // result dtype
  int args[3] = {-1, -1, -1};    // registers: inputs first, then instruction results
};

struct FusedProgram {
  std::vector<DType> input_dtypes;
  std::vector<FusedInstruction> body;
  std::vector<int> outputs;  // registers
};

enum class FusedReduceOp { Sum, Max };

struct FusedPlan;  // where each register of a tile lives (fused_elementwise.cpp)

// A program prepared for repeated runs over one `shape`: the program is checked and its
// tile plan built once (per pattern of inputs sharing memory with outputs), so runs
// after the first allocate nothing. Safe to run from several threads at once.
//
// inputs[i] is read with input_strides[i] (element strides over `shape`, 0 where
// broadcast).
class FusedKernel {
 public:
  FusedKernel(FusedProgram program, std::vector<Strides> input_strides, Shape shape);
  ~FusedKernel();
  FusedKernel(const FusedKernel&) = delete;
  FusedKernel& operator=(const FusedKernel&) = delete;

  const FusedProgram& program() const { return program_; }
  const Shape& shape() const { return shape_; }

  // outputs[j] is a dense buffer of numel(shape) elements of the dtype of register
  // program.outputs[j]. An output may share its buffer with an input that is not
  // broadcast (that input is then copied tile by tile before the tile is written).
  void run(const void* const* inputs, void* const* outputs) const;

  // out[r] = reduce over c < len of program.outputs[0] at element (r * len + c) of
  // `shape` (numel(shape) == rows * len): the trailing-axes reduction of cpu::reduce,
  // bitwise. out has the register's dtype; the program must have one output.
  void reduce(const void* const* inputs, FusedReduceOp op, int64_t rows, int64_t len, void* out) const;

 private:
  std::shared_ptr<const FusedPlan> plan_for(const void* const* inputs, void* const* outputs, bool direct_outputs) const;

  FusedProgram program_;
  std::vector<Strides> strides_;
  Shape shape_;
  struct CachedPlan {
    std::vector<uint8_t> aliased;  // per input: shares memory with an output
    bool direct_outputs = true;
    std::shared_ptr<const FusedPlan> plan;
  };
  mutable std::mutex mutex_;
  mutable std::vector<CachedPlan> plans_;
};

// One-shot forms of FusedKernel::run / reduce (they build the plan on every call).
void fused_elementwise(const FusedProgram& program, const std::vector<const void*>& inputs,
                       const std::vector<Strides>& input_strides, const std::vector<void*>& outputs,
                       const Shape& shape);
void fused_reduce(const FusedProgram& program, const std::vector<const void*>& inputs,
                  const std::vector<Strides>& input_strides, const Shape& shape, FusedReduceOp op, int64_t rows,
                  int64_t len, void* out);

}  // namespace tessera::cpu
