// Gather and scatter-add along one axis: the kernels behind take (embedding lookup)
// and its gradient. A buffer is viewed as [outer, axis_len, inner].
#pragma once

#include <cstdint>

#include "tessera/base/dtype.h"

namespace tessera::cpu {

// out[o, i, r] = x[o, idx[i], r] for o < outer, i < n_idx, r < inner (out: [outer, n_idx, inner]).
// Negative indices count from the end; out-of-range indices throw ValueError naming the
// position and value. All dtypes.
void gather(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
            int64_t n_idx, void* out);

// out[o, idx[i], r] += updates[o, i, r] (out must be initialized by the caller).
// Deterministic: duplicates are accumulated in index order. float and integer dtypes.
void scatter_add(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
                 int64_t n_idx, void* out);

// take_along_axis: out[o, j, r] = x[o, idx[o, j, r], r] with idx: [outer, n_idx, inner].
void gather_along(DType dtype, const void* x, int64_t outer, int64_t axis_len, int64_t inner, const int64_t* idx,
                  int64_t n_idx, void* out);
void scatter_add_along(DType dtype, const void* updates, int64_t outer, int64_t axis_len, int64_t inner,
                       const int64_t* idx, int64_t n_idx, void* out);

}  // namespace tessera::cpu
