// expert_dispatch / expert_combine on the CPU (ir/primitives/expert_dispatch.h): row
// copies between a group's expert-sorted rows and the shards' zero-padded buffers.
#include <cstring>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/expert_dispatch.h"

namespace tessera {

void ExpertDispatch::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& in = inputs[0];
  const Array& sizes = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  const Array& groups_side = combine_ ? out : in;  // [G, N, D]
  const int64_t groups = groups_side.shape(0), rows = groups_side.shape(1), experts = sizes.shape(1);
  const int64_t per_shard = experts / shards_;
  const size_t row_bytes = static_cast<size_t>(groups_side.shape(2)) * in.itemsize();
  const size_t group_bytes = static_cast<size_t>(rows) * row_bytes;
  const std::vector<int64_t> counts = sizes.to_vector<int64_t>();
  const auto* src = static_cast<const char*>(in.raw_data());
  auto* dst = static_cast<char*>(out.mutable_raw_data());
  std::memset(dst, 0, out.nbytes());
  for (int64_t g = 0; g < groups; ++g) {
    int64_t start = 0;
    for (int64_t s = 0; s < shards_; ++s) {
      int64_t n = 0;
      for (int64_t e = s * per_shard; e < (s + 1) * per_shard; ++e) {
        const int64_t c = counts[static_cast<size_t>(g * experts + e)];
        if (c < 0) fail<ValueError>("{}: expert {} of group {} has {} rows (expected >= 0)", name(), e, g, c);
        n += c;
      }
      if (start + n > rows)
        fail<ValueError>("{}: group {} routes {} rows or more, but holds {}", name(), g, start + n, rows);
      // The group's rows [start, start + n) <-> shard s's buffer rows [0, n).
      const size_t group_at = static_cast<size_t>(g) * group_bytes + static_cast<size_t>(start) * row_bytes;
      const size_t shard_at = static_cast<size_t>(s * groups + g) * group_bytes;
      const size_t bytes = static_cast<size_t>(n) * row_bytes;
      if (bytes > 0) std::memcpy(dst + (combine_ ? group_at : shard_at), src + (combine_ ? shard_at : group_at), bytes);
      start += n;
    }
  }
}

}  // namespace tessera
