// Expert parallelism's dropless dispatch and combine in global terms (nn/moe.cpp): a
// routing group's assignments, sorted by expert, handed to the S shards of the experts
// (E / S experts each) and back. Only the routed rows move: on a mesh whose expert axes
// split the groups, the partitioner lowers each to a ragged all-to-all over those axes
// (spmd/ragged_all_to_all.h, rules_indexing.cpp), whose bytes are the rows really sent.
//
//   expert_dispatch(x [G, N, D], sizes [G, E]) {shards=S, axes=[expert]} -> [S, G, N, D]:
//     out[s, g, r] = x[g, off(g, s) + r] for r < cnt(g, s), else 0, where
//     cnt(g, s) = sizes[g, s E/S : (s+1) E/S] summed and off(g, s) = sizes[g, 0 : s E/S] summed;
//   expert_combine(y [S, G, N, D], sizes [G, E]) {axes=[expert]} -> [G, N, D]: the
//     transpose, out[g, off(g, s) + r] = y[s, g, r] for r < cnt(g, s); rows past the
//     group's assignments are 0.
//
// Each is the other's vjp (sizes: int32 or int64, no gradient). `axes` names the mesh
// axes the shards split over (the logical "experts" axes when traced); a mesh without
// them runs the op on each device's groups as written.
#pragma once

#include <string>
#include <vector>

#include "tessera/ir/primitive.h"

namespace tessera {

class ExpertDispatch : public Primitive {
 public:
  ExpertDispatch(bool combine, int64_t shards, std::vector<std::string> axes)
      : combine_(combine), shards_(shards), axes_(std::move(axes)) {}
  bool combine() const { return combine_; }
  int64_t shards() const { return shards_; }
  const std::vector<std::string>& axes() const { return axes_; }
  std::string name() const override { return combine_ ? "expert_combine" : "expert_dispatch"; }
  // "shards=2, axes=[expert]".
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_COST

 private:
  bool combine_;
  int64_t shards_;
  std::vector<std::string> axes_;
};

// The nodes, with shape and dtype checks (ShapeError / DTypeError naming the operands).
Array expert_dispatch(const Array& x, const Array& sizes, int64_t shards, const std::vector<std::string>& axes);
Array expert_combine(const Array& y, const Array& sizes, const std::vector<std::string>& axes);

// "[expert, data]" <-> {"expert", "data"} (the attribute's text; the parser reads it back).
std::string axis_list_text(const std::vector<std::string>& axes);
std::vector<std::string> parse_axis_list(const std::string& text, const std::string& op);

}  // namespace tessera
