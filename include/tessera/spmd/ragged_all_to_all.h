// The ragged all-to-all of expert parallelism's dropless dispatch and combine: the
// partitioner's lowering of expert_dispatch / expert_combine (ir/primitives/
// expert_dispatch.h) over the expert axes. Shapes are local (per device), and only the
// rows routed to another member's experts travel (Communicator::all_to_all_v).
//
// Over a group of S members (the axes; this device is member s) with Gl routing groups
// on each, E experts, El = E / S on each member, and
//   sizes [S Gl, E]: every member's groups' assignments per expert (row t Gl + j is
//                    member t's group j), the same on every member;
//   cnt(t, j, q) = sizes[t Gl + j, q El : (q + 1) El] summed: the rows member t's group j
//                  sends member q, which start at off(t, j, q) = sizes[t Gl + j, 0 : q El] summed;
//   dispatch  x [Gl, N, D] (each group's rows sorted by expert) -> out [1, S Gl, N, D]:
//             out[0, t Gl + j, r] = member t's x[j, off(t, j, s) + r] for r < cnt(t, j, s), else 0;
//   combine   the transpose: y [1, S Gl, N, D] -> out [Gl, N, D]:
//             out[j, off(s, j, q) + r] = member q's y[0, s Gl + j, r] for r < cnt(s, j, q);
//             rows past the group's assignments are 0.
// Each is the other's vjp (the sizes get a zero cotangent). Over a group of one device
// it runs without a communicator.
#pragma once

#include <vector>

#include "tessera/core/array.h"
#include "tessera/spmd/communicator.h"
#include "tessera/spmd/mesh.h"

namespace tessera::spmd {

class RaggedAllToAll : public Primitive {
 public:
  RaggedAllToAll(bool combine, Mesh mesh, std::vector<int> axes);
  bool combine() const { return combine_; }
  const Mesh& mesh() const { return mesh_; }
  const std::vector<int>& axes() const { return axes_; }
  int group_size() const { return mesh_.group_size(axes_); }
  // The bytes a device sends when the router spreads its rows evenly: (S-1)/S of its
  // groups' rows (`groups_bytes`, the [Gl, N, D] side): the plan's figure (cost, the
  // partitioner's summary). A run's statistics count the rows that moved.
  double planned_bytes(double groups_bytes) const;

  std::string name() const override { return "ragged_all_to_all"; }
  // "axes=[expert], combine=false, mesh=(expert=2)".
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST

 private:
  bool combine_;
  Mesh mesh_;
  std::vector<int> axes_;
};

// Builders on local arrays (shape checks included): x [Gl, N, D] -> [1, S Gl, N, D] and
// back; sizes [S Gl, E] int32 or int64 with E divisible by S.
Array ragged_dispatch(const Array& x, const Array& sizes, const Mesh& mesh, const std::vector<int>& axes);
Array ragged_combine(const Array& y, const Array& sizes, const Mesh& mesh, const std::vector<int>& axes);

// The exchange on host memory (the CPU eval, and the CUDA kernel after staging):
// `in` and `out` as the primitive's local shapes say (row_bytes = D * itemsize, N rows
// per group), `sizes` [S Gl, E] as int64. `comm` may be null when S = 1.
void ragged_exchange(const RaggedAllToAll& op, const std::vector<int64_t>& sizes, int64_t experts, int64_t groups,
                     int64_t rows, size_t row_bytes, const char* in, char* out, Communicator* comm, int device);

}  // namespace tessera::spmd
