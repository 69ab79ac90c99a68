// Lane address patterns of ldmatrix for the v2 attention kernels, as plain constexpr
// functions so that a host test (tests/cuda/test_cuda_attention.cpp, FragmentPatterns)
// can check them against the mma.sync m16n8k16 fragment layout without a GPU.
//
// ldmatrix.sync.aligned.m8n8.x4.b16 (PTX ISA, "Warp-level matrix load instruction:
// ldmatrix"): four 8 x 8 matrices of 16-bit elements; lane l supplies the shared-memory
// address of row l % 8 of matrix l / 8 (16 contiguous bytes). Destination register i
// then holds, in lane l, two elements of matrix i:
//   plain:  M_i[l / 4][2 (l % 4)], M_i[l / 4][2 (l % 4) + 1]       (low half first)
//   .trans: M_i[2 (l % 4)][l / 4], M_i[2 (l % 4) + 1][l / 4]
// With g = l / 4 and t = l % 4, the m16n8k16 fragments (flash_attention_common.cuh):
//   A (16 x 16, M x K): a[0] = A[g][2t..], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
//                       a[3] = A[g+8][2t+8..]
//   B (16 x 8,  K x N): b[0] = B[2t..][g],  b[1] = B[2t+8..][g]
// Each function below returns the (row, column) of the tile element whose address lane
// l supplies, relative to the 16 x 16 block being loaded.
#pragma once

namespace tessera::cuda::flash {

struct LaneRowCol {
  int row, col;
};

// A from a row-major [M][K] tile (Q): matrices (rows 0-7, cols 0-7), (rows 8-15, cols
// 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) give a[0], a[1], a[2], a[3].
constexpr LaneRowCol ldsm_a_lane(int lane) { return {lane % 16, 8 * (lane / 16)}; }

// B = X^T from a row-major [N][K] tile X (K in S = Q K^T: B[k][n] = K[n][k]), two
// n-tiles of 8 at once: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
// (n 8-15, k 8-15), loaded plain, give b[0], b[1] of n-tile 0 and b[0], b[1] of n-tile 1
// (plain: lane l holds X[g][2t..] = B[2t..][g]).
constexpr LaneRowCol ldsm_b_nk_lane(int lane) { return {lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2)}; }

// B from a row-major [K][N] tile Y (V in O = P V: B[k][n] = V[k][n]), two n-tiles of 8 at
// once: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15),
// loaded .trans, give b[0], b[1] of n-tile 0 and b[0], b[1] of n-tile 1 (.trans: lane l
// holds Y[2t..][g] = B[2t..][g]). The same pattern as ldsm_a_lane.
constexpr LaneRowCol ldsm_b_kn_trans_lane(int lane) { return {lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16)}; }

}  // namespace tessera::cuda::flash
