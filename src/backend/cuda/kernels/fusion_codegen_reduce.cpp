// Fusion code generator, part 3 of 3 (see fusion_codegen_detail.h): the kernels of a
// fused reduction (sum or max of the program's one output over the trailing axes):
// @NAME@_rows (a block per row chunk), @NAME@_warps (a warp per short row) and
// @NAME@_finish (a warp per row over the rows kernel's chunk partials).
#include <fmt/format.h>

#include "backend/cuda/kernels/fusion_codegen_detail.h"

namespace tessera::cuda::detail {

void append_reduce_kernels(std::string& s, const FusedProgram& p) {
  const DType d = p.register_dtype(p.outputs.at(0));
  const std::string acc = accumulator_type(d);
  const bool sum = p.reduce == FusedReduce::Sum;
  std::string combine, identity;
  if (sum) {
    combine = acc == "long long" ? "(long long)((unsigned long long)a + (unsigned long long)b)" : "a + b";
    identity = "(" + acc + ")0";
  } else {
    combine = "(b > a || b != b) ? b : a";  // NaN wins
    identity = acc == "float"    ? "-__int_as_float(0x7f800000)"
               : acc == "double" ? "-__longlong_as_double(0x7ff0000000000000LL)"
                                 : "(-9223372036854775807LL - 1)";
  }
  // The accumulator as the output register, then stored.
  const std::string as_register = d == DType::Bool    ? "(acc != 0)"
                                  : is_float_class(d) ? "acc"
                                                      : fmt::format("({})acc", register_type(d));
  const std::string store = store_expr(d, as_register);
  s += fmt::format(R"CUDA(
// ---- fused reduction ({0} over the trailing axes), accumulated in {1} ----
typedef {1} Acc;
__device__ __forceinline__ Acc ts_identity() {{ return {2}; }}
__device__ __forceinline__ Acc ts_combine(Acc a, Acc b) {{ return {3}; }}
// Fixed shuffle tree: lane l takes lane l + o for o = 16, 8, 4, 2, 1 (result in lane 0).
__device__ __forceinline__ Acc ts_warp_reduce(Acc v) {{
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = ts_combine(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}}
// Block of a multiple of 32 threads: warps, then warp 0 over the warp results (thread 0).
__device__ __forceinline__ Acc ts_block_reduce(Acc v, Acc* shared) {{
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = ts_warp_reduce(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) v = ts_warp_reduce(lane < (int)(blockDim.x >> 5) ? shared[lane] : ts_identity());
  __syncthreads();  // shared is reused by the block's next row
  return v;
}}
template <typename I>
__device__ __forceinline__ Acc ts_reduce_span(const Args& a, I base, I c, I end, I step) {{
  Acc acc = ts_identity();
  for (; c < end; c += step) {{
    {4}
    ts_element<I>(a, base + c, o0);
    acc = ts_combine(acc, (Acc)o0);
  }}
  return acc;
}}
// Thread's share of row `row`, columns c0 + first, c0 + first + step, ... < c1.
__device__ __forceinline__ Acc ts_row_span(const Args& a, long long row, long long c0, long long c1, int first,
                                           int step) {{
  if ((unsigned long long)a.n + 1024ull <= 0xffffffffull)
    return ts_reduce_span<unsigned int>(a, (unsigned int)(row * a.len), (unsigned int)(c0 + first), (unsigned int)c1,
                                        (unsigned int)step);
  return ts_reduce_span<unsigned long long>(a, (unsigned long long)(row * a.len), (unsigned long long)(c0 + first),
                                            (unsigned long long)c1, (unsigned long long)step);
}}
// A block per (row, chunk): the row's columns [chunk * chunk_len, +chunk_len); with one
// chunk the block writes the output, else its partial.
extern "C" __global__ void __launch_bounds__(256) @NAME@_rows(const Args a) {{
  __shared__ Acc shared[32];
  const long long units = a.rows * a.chunks;
  for (long long u = blockIdx.x; u < units; u += gridDim.x) {{
    const long long row = u / a.chunks, chunk = u - row * a.chunks;
    const long long c0 = chunk * a.chunk_len;
    const long long c1 = a.len - c0 < a.chunk_len ? a.len : c0 + a.chunk_len;
    Acc acc = ts_row_span(a, row, c0, c1, (int)threadIdx.x, (int)blockDim.x);
    acc = ts_block_reduce(acc, shared);
    if (threadIdx.x == 0) {{
      if (a.chunks == 1) {{
        a.out0[row] = {5};
      }} else {{
        static_cast<Acc*>(a.partial)[u] = acc;
      }}
    }}
  }}
}}
// A warp per row (short rows).
extern "C" __global__ void __launch_bounds__(256) @NAME@_warps(const Args a) {{
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < a.rows; row += warps) {{
    Acc acc = ts_warp_reduce(ts_row_span(a, row, 0, a.len, lane, 32));
    if (lane == 0) a.out0[row] = {5};
  }}
}}
// A warp per row over the rows kernel's chunk partials, in chunk order.
extern "C" __global__ void __launch_bounds__(256) @NAME@_finish(const Args a) {{
  const int lane = threadIdx.x & 31;
  const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
  const Acc* partial = static_cast<const Acc*>(a.partial);
  for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < a.rows; row += warps) {{
    Acc acc = ts_identity();
    for (long long k = lane; k < a.chunks; k += 32) acc = ts_combine(acc, partial[row * a.chunks + k]);
    acc = ts_warp_reduce(acc);
    if (lane == 0) a.out0[row] = {5};
  }}
}}
)CUDA",
                   sum ? "sum" : "max", acc, identity, combine, output_decls(p), store);
}

}  // namespace tessera::cuda::detail
