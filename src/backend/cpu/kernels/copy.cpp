// Strided copies (transpose, slice, broadcast, pad/concat stores) as byte moves.
//
// Both directions go through one kernel: dst[sum i_k dst_strides[k]] = src[sum i_k
// src_strides[k]]. After collapsing dims, a copy whose innermost dim is unit-stride on
// both sides (head split/merge, slices, concatenation) moves whole rows with vector
// moves, in the loop order that keeps both sides streaming (copy_rows); one with a
// non-unit innermost stride (a transpose) is cache-blocked over the last two dims (AVX2
// 8x8 register transposes for 4-byte elements, else kTile x kTile tiles), so each tile
// reads and writes whole cache lines.
#include "backend/cpu/kernels/copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "backend/cpu/kernels/elementwise_detail.h"

namespace tessera::cpu {
namespace {

constexpr int64_t kTile = 32;
// The AVX2 4-byte transpose: a task is a band of kBand destination rows (= source
// columns); it walks the source kSrcBlock rows at a time, so each source row visit
// reads kBand * 4 = 1 KiB contiguous and each destination row gets 128 contiguous
// bytes per step. Measured on the 8192x2048 bench shape: ~1.4x the 128 x 16 blocking.
constexpr int64_t kBand = 256;
constexpr int64_t kSrcBlock = 32;

#ifdef __AVX2__
// dst[r, c] = src[r + c * pitch] for an 8x8 block of 4-byte elements, via an in-register
// transpose: 8 contiguous source loads, 8 contiguous destination stores.
inline void transpose8x8(const uint32_t* src, int64_t pitch, uint32_t* dst, int64_t dst_pitch) {
  __m256 v[8], t[8];
  for (int k = 0; k < 8; ++k) v[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + k * pitch));
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {
    v[4 * k + 0] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    v[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xee);
    v[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    v[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xee);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_permute2f128_ps(v[k], v[k + 4], 0x20);
    t[k + 4] = _mm256_permute2f128_ps(v[k], v[k + 4], 0x31);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(reinterpret_cast<float*>(dst + k * dst_pitch), t[k]);
}
#endif

template <typename U>
void copy_tiled(const detail::Layout<2>& layout, const U* src, U* dst) {
  const int nd = static_cast<int>(layout.shape.size());
  const int64_t rows = layout.shape[nd - 2], cols = layout.shape[nd - 1];
  const int64_t ss0 = layout.strides[0][nd - 2], ss1 = layout.strides[0][nd - 1];
  const int64_t ds0 = layout.strides[1][nd - 2], ds1 = layout.strides[1][nd - 1];
  int64_t outer = 1;
  for (int d = 0; d < nd - 2; ++d) outer *= layout.shape[d];
  bool avx_transpose = false;
#ifdef __AVX2__
  avx_transpose = sizeof(U) == 4 && ss0 == 1 && ds1 == 1;
#endif
  // One unit = one band of `band` rows of one outer index.
  const int64_t band = avx_transpose ? kBand : kTile;
  const int64_t row_tiles = (rows + band - 1) / band;
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, cols * band));
  parallel_for(outer * row_tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      int64_t o = u / row_tiles, r0 = (u % row_tiles) * band;
      int64_t so = 0, dof = 0, rem = o;
      for (int d = nd - 3; d >= 0; --d) {
        int64_t i = rem % layout.shape[d];
        rem /= layout.shape[d];
        so += i * layout.strides[0][d];
        dof += i * layout.strides[1][d];
      }
      const int64_t r1 = std::min(rows, r0 + band);
#ifdef __AVX2__
      // Pure transpose of 4-byte elements: 8x8 register blocks, visited in 16-row x
      // kSrcBlock-column groups so every 64-byte line read or written is used whole
      // before it is evicted.
      if constexpr (sizeof(U) == 4) {
        if (avx_transpose && (r1 - r0) % 8 == 0) {
          const int64_t cblocks = cols / kSrcBlock * kSrcBlock, c8 = cols / 8 * 8;
          auto block = [&](int64_t r, int64_t c) {
            transpose8x8(src + so + r + c * ss1, ss1, dst + dof + r * ds0 + c, ds0);
          };
          for (int64_t c0 = 0; c0 < cblocks; c0 += kSrcBlock)
            for (int64_t rr = r0; rr < r1; rr += 16)
              for (int64_t c = c0; c < c0 + kSrcBlock; c += 8)
                for (int64_t r = rr; r < std::min(rr + 16, r1); r += 8) block(r, c);
          for (int64_t c = cblocks; c < c8; c += 8)
            for (int64_t r = r0; r < r1; r += 8) block(r, c);
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c8; c < cols; ++c) dst[dof + r * ds0 + c] = src[so + r + c * ss1];
          continue;
        }
      }
#endif
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t c1 = std::min(cols, c0 + kTile);
        for (int64_t r = r0; r < r1; ++r) {  // (r1 - r0 may exceed kTile on a ragged AVX band)
          const U* s = src + so + r * ss0;
          U* t = dst + dof + r * ds0;
          for (int64_t c = c0; c < c1; ++c) t[c * ds1] = s[c * ss1];
        }
      }
    }
  });
}

template <typename U>
void copy_runs(const detail::Layout<2>& layout, const U* src, U* dst) {
  const int64_t ss = layout.strides[0].back(), ds = layout.strides[1].back();
  parallel_for(layout.numel, detail::kStreamGrain, [&](int64_t begin, int64_t end) {
    detail::for_each_run<2>(layout, begin, end, [&](const std::array<int64_t, 2>& off, int64_t n) {
      const U* s = src + off[0];
      U* d = dst + off[1];
      if (ss == 1 && ds == 1) {
        std::memcpy(d, s, sizeof(U) * n);
      } else if (ss == 0 && ds == 1) {
        std::fill(d, d + n, s[0]);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
      }
    });
  });
}

// Moves `bytes` bytes (no overlap). Runs of a transpose/slice are short (often 64..1024
// bytes) and many, so an inline AVX loop beats a libc memcpy call per run; the tail
// is one overlapping 32-byte move.
inline void move_run(unsigned char* dst, const unsigned char* src, int64_t bytes) {
#ifdef __AVX2__
  if (bytes >= 32) {
    int64_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
      __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
      __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
      __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
    }
    for (; i + 32 <= bytes; i += 32)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    if (i < bytes)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + bytes - 32),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + bytes - 32)));
    return;
  }
#endif
  std::memcpy(dst, src, static_cast<size_t>(bytes));
}

// Copies whose innermost collapsed dim is unit-stride on both sides (head split/merge
// permutations, slices, concatenate stores): whole rows of `inner` elements are moved
// at once. Work is split in fixed units (a row, or a kStreamGrain-element piece of a
// long row); row offsets are stepped like an odometer, so a row costs a few adds.
void copy_rows(const detail::Layout<2>& layout, const unsigned char* src, unsigned char* dst, int64_t item) {
  const int nd = static_cast<int>(layout.shape.size());
  const int64_t inner = layout.shape[nd - 1];
  const int64_t rows = layout.numel / inner;
  const int64_t pieces = (inner + detail::kStreamGrain - 1) / detail::kStreamGrain;
  const int64_t piece = (inner + pieces - 1) / pieces;
  const int64_t grain = std::max<int64_t>(1, detail::kStreamGrain / piece);
  parallel_for(rows * pieces, grain, [&](int64_t begin, int64_t end) {
    int64_t idx[16] = {};
    int64_t so = 0, dof = 0, rem = begin / pieces;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = rem % layout.shape[d];
      rem /= layout.shape[d];
      so += idx[d] * layout.strides[0][d];
      dof += idx[d] * layout.strides[1][d];
    }
    for (int64_t u = begin; u < end; ++u) {
      const int64_t c0 = (u % pieces) * piece, n = std::min(inner, c0 + piece) - c0;
      move_run(dst + (dof + c0) * item, src + (so + c0) * item, n * item);
      if ((u + 1) % pieces != 0) continue;
      for (int d = nd - 2; d >= 0; --d) {
        so += layout.strides[0][d];
        dof += layout.strides[1][d];
        if (++idx[d] < layout.shape[d]) break;
        so -= idx[d] * layout.strides[0][d];
        dof -= idx[d] * layout.strides[1][d];
        idx[d] = 0;
      }
    }
  });
}

// Loop order for copy_rows. Walking the destination in order, the source side of an
// inner-contiguous permutation is either one stream with gaps (split heads: 256-byte
// runs 1 KiB apart, which the hardware prefetcher handles badly) or a few far-apart
// streams that each advance sequentially (merge heads). Walking the source in order
// swaps the roles. We take the order whose innermost outer dim is shorter, i.e. the one
// whose scattered side is a few sequential streams: ~2x on the cold [8,256,4,64]
// split. Ties keep the destination order.
detail::Layout<2> order_for_streams(const detail::Layout<2>& layout) {
  const int outer = static_cast<int>(layout.shape.size()) - 1;
  if (outer < 2) return layout;
  SmallVec<int, 16> by_src;
  for (int d = 0; d < outer; ++d) by_src.push_back(d);
  // Stable insertion sort by decreasing |source stride| (std::stable_sort would
  // allocate a buffer: compiled programs run allocation-free; at most 15 dims).
  for (int i = 1; i < outer; ++i) {
    const int d = by_src[i];
    int j = i;
    for (; j > 0 && std::abs(layout.strides[0][by_src[j - 1]]) < std::abs(layout.strides[0][d]); --j)
      by_src[j] = by_src[j - 1];
    by_src[j] = d;
  }
  if (layout.shape[by_src[outer - 1]] >= layout.shape[outer - 1]) return layout;
  detail::Layout<2> out = layout;
  for (int d = 0; d < outer; ++d) {
    out.shape[d] = layout.shape[by_src[d]];
    for (int k = 0; k < 2; ++k) out.strides[k][d] = layout.strides[k][by_src[d]];
  }
  return out;
}

void copy_general(DType dtype, const void* src, DimsRef src_strides, void* dst, DimsRef dst_strides, DimsRef shape) {
  auto layout = detail::collapse<2>(shape, {src_strides, dst_strides});
  if (layout.numel == 0) return;
  const int64_t item = static_cast<int64_t>(itemsize(dtype));
  // Runs shorter than one vector move go through the generic per-run walk below.
  constexpr int64_t kMinRunBytes = 32;
  if (layout.strides[0].back() == 1 && layout.strides[1].back() == 1 && layout.shape.back() * item >= kMinRunBytes) {
    copy_rows(order_for_streams(layout), static_cast<const unsigned char*>(src), static_cast<unsigned char*>(dst),
              item);
    return;
  }
  detail::dispatch_bytes(dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* s = static_cast<const U*>(src);
    U* d = static_cast<U*>(dst);
    const int64_t ss = layout.strides[0].back(), ds = layout.strides[1].back();
    const bool strided_inner = (ss != 1 && ss != 0) || ds != 1;
    if (layout.shape.size() >= 2 && strided_inner) {
      copy_tiled<U>(layout, s, d);
    } else {
      copy_runs<U>(layout, s, d);
    }
  });
}

void check_rank(std::string_view op, DimsRef shape, DimsRef strides) {
  if (strides.size() != shape.size())
    fail<ShapeError>("{}: strides rank does not match shape {} (got {} strides)", op,
                     to_string(Shape(shape.begin(), shape.end())), strides.size());
  for (int64_t d : shape)
    if (d < 0) fail<ShapeError>("{}: negative dim in shape {}", op, to_string(Shape(shape.begin(), shape.end())));
}

}  // namespace

void strided_copy(DType dtype, const void* src, int64_t src_offset, DimsRef src_strides, DimsRef shape, void* dst) {
  check_rank("strided_copy", shape, src_strides);
  const auto* s = static_cast<const unsigned char*>(src) + src_offset * static_cast<int64_t>(itemsize(dtype));
  SmallDims dst_strides;
  contiguous_strides_into(shape, dst_strides);
  copy_general(dtype, s, src_strides, dst, dst_strides, shape);
}

void strided_store(DType dtype, const void* src, const Shape& shape, void* dst, int64_t dst_offset,
                   DimsRef dst_strides) {
  check_rank("strided_store", shape, dst_strides);
  auto* d = static_cast<unsigned char*>(dst) + dst_offset * static_cast<int64_t>(itemsize(dtype));
  SmallDims src_strides;
  contiguous_strides_into(shape, src_strides);
  copy_general(dtype, src, src_strides, d, dst_strides, shape);
}

}  // namespace tessera::cpu
