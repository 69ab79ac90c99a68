#include "tessera/plan/systolic.h"

#include <algorithm>

#include "tessera/base/error.h"

namespace tessera::plan {
namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

MatrixUnitUse matrix_unit_use(int64_t batch, int64_t m, int64_t n, int64_t k, const std::array<int64_t, 3>& tile,
                              int64_t units) {
  if (batch < 1 || m < 1 || n < 1 || k < 1)
    fail<ValueError>("matrix_unit_use: GEMM dimensions must be positive (batch {}, m {}, n {}, k {})", batch, m, n, k);
  if (tile[0] < 1 || tile[1] < 1 || tile[2] < 1 || units < 1)
    fail<ValueError>("matrix_unit_use: tile [{}, {}, {}] and units {} must be positive", tile[0], tile[1], tile[2],
                     units);
  MatrixUnitUse use;
  const int64_t pm = ceil_div(m, tile[0]), pn = ceil_div(n, tile[1]), pk = ceil_div(k, tile[2]);
  use.tile_utilization = static_cast<double>(m) / static_cast<double>(pm * tile[0]) * static_cast<double>(n) /
                         static_cast<double>(pn * tile[1]) * static_cast<double>(k) / static_cast<double>(pk * tile[2]);
  const int64_t output_tiles = batch * pm * pn;
  if (output_tiles < units) use.split_k = std::max<int64_t>(1, std::min(units / output_tiles, pk / kMinSplitKTiles));
  use.tiles = output_tiles * use.split_k;
  use.waves = ceil_div(use.tiles, units);
  use.wave_utilization = static_cast<double>(use.tiles) / static_cast<double>(use.waves * units);
  return use;
}

}  // namespace tessera::plan
