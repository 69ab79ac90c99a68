// CollectivePlan: one collective primitive lowered to the buffer moves a device runs:
// strided copies, zero fills, ordered sums, and exchanges of equal blocks between the
// members of the group — only the two exchanges every transport has (all-gather and
// all-to-all of whole blocks, in group order). Reductions never use a transport's own
// sum: reduce-scatter is an all-to-all of the blocks and an ordered sum
// ((m0 + m1) + m2) + ... of what arrived, all-reduce a reduce-scatter of the padded
// buffer and an all-gather of the sums. So every backend that runs the plan (the GPU's
// device copies and kernels, NCCL's sends across GPUs, the host emulation below) gives
// bitwise what the CPU communicators give for the same inputs, and the sums move
// 2(n-1)/n of the buffer as a ring all-reduce does.
//
// Layout changes follow Collective::eval_cpu: the communicator's member-major block
// layout [n][outer][row] and the row-major layout split along a dim [outer][n][row]
// differ by a copy of `outer` rows of `row` bytes per member (a 2-D strided copy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/communicator.h"

namespace tessera::spmd {

// Where a step reads or writes: the collective's input, its output, or the plan's
// staging scratch (CollectivePlan::staging_bytes), at a byte offset.
struct PlanRef {
  enum class Buffer { Input, Output, Staging } buffer = Buffer::Input;
  size_t offset = 0;
};

struct PlanStep {
  enum class Kind {
    // `rows` rows of `width` bytes from src to dst; rows start `src_pitch` and
    // `dst_pitch` bytes apart (pitch >= width).
    Copy,
    // `width` zero bytes at dst (all-zero bytes are 0 in every dtype).
    Zero,
    // Member k's `width` bytes at src land at dst + k * width on every member.
    AllGather,
    // src holds one block of `width` bytes per member; member k's block j lands at
    // dst + k * width on member j.
    AllToAll,
    // dst[i] = ((src[i] + src[stride + i]) + src[2 stride + i]) + ... over `members`
    // blocks, i < count (elements of the plan's dtype; 16-bit floats rounded after
    // every addition, integers wrapping, as add_into does).
    OrderedSum,
  } kind = Kind::Copy;
  PlanRef src, dst;
  size_t width = 0, rows = 1, src_pitch = 0, dst_pitch = 0;
  size_t count = 0, stride = 0;  // OrderedSum (elements)
  int members = 0;               // OrderedSum
};

struct CollectivePlan {
  CollectiveKind kind = CollectiveKind::AllReduce;
  DType dtype = DType::Float32;
  int members = 1;           // the group's size
  size_t input_bytes = 0;    // local input
  size_t output_bytes = 0;   // local output
  size_t staging_bytes = 0;  // scratch the steps use (0: none)
  std::vector<PlanStep> steps;

  // "reduce_scatter over 4: copy x4, all_to_all 96 B, ordered_sum 6 x4" (tests, errors).
  std::string to_string() const;
};

// The plan of `collective` for a local input of `input_shape` and `dtype` on the member
// at `index` of the group (0 <= index < group size). Empty inputs or outputs give no
// steps (every member skips the collective together, as eval_cpu does).
CollectivePlan plan_collective(const Collective& collective, const Shape& input_shape, DType dtype, int64_t index);

// The host emulation: runs `plan` on host buffers, the exchanges through `comm` (the
// caller's device and group, as Collective::eval_cpu passes them). staging must hold
// plan.staging_bytes. What the GPU backend runs with device copies, tested against
// eval_cpu bitwise where no GPU is.
void run_collective_plan(const CollectivePlan& plan, const void* input, void* output, void* staging, Communicator& comm,
                         int device, const std::vector<int>& group);

// Collectives a device runs from a plan outside any Communicator (the GPU backend's
// device copies) count here, per mesh device, as a communicator counts its own calls:
// one call of the plan's kind, its full buffer moved as a ring would (CommStats), no
// seconds (the time waiting for peers is the communicator's: the in-process transport
// meets at its barriers). SpmdExecutable adds them to the communicator's figures.
void record_device_collective(int device, const CollectivePlan& plan);
CommStats device_collective_stats(int device);

}  // namespace tessera::spmd
