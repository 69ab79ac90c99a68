// How well a GEMM fills an accelerator's matrix units (the second seed's systolic
// arrays): a matrix unit computes whole tiles, so a GEMM pays for its dimensions
// rounded up to the tile (an MXU is 128x128 or 256x256; a tensor-core GEMM runs CTA
// tiles such as 128x128x64), and its output tiles are spread over `units` units in
// waves, the last of which may be partly idle.
//
//   tile utilization = m n k / (pad(m) pad(n) pad(k)),  pad(x) = x rounded up to the tile
//   tiles            = batch * ceil(m / tm) * ceil(n / tn)
//   wave utilization = tiles / (ceil(tiles / units) * units)
//
// When there are fewer output tiles than units, libraries split the reduction (split-K,
// stream-K): the K loop is divided into up to units / tiles parts of at least
// kMinSplitKTiles tiles of K each, and those parts count as tiles.
#pragma once

#include <array>
#include <cstdint>

namespace tessera::plan {

inline constexpr int64_t kMinSplitKTiles = 4;

struct MatrixUnitUse {
  double tile_utilization = 1;
  double wave_utilization = 1;
  int64_t tiles = 0;  // work items after any split of K
  int64_t waves = 0;
  int64_t split_k = 1;
  double utilization() const { return tile_utilization * wave_utilization; }
};

// batch independent m x k times k x n products. tile = {tm, tn, tk}; units >= 1.
// ValueError on a non-positive dimension, tile or unit count.
MatrixUnitUse matrix_unit_use(int64_t batch, int64_t m, int64_t n, int64_t k, const std::array<int64_t, 3>& tile,
                              int64_t units);

}  // namespace tessera::plan
