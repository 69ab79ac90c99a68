// The grouped matmuls on the CPU (ir/primitives/grouped_matmul.h): one GEMM of the
// linalg kernels per (batch, group) block of rows, so each block is bitwise the matmul
// of those rows for any thread count; the weight gradient adds the batches' blocks in
// order g = 0, 1, ... (add_into: each dtype in its own precision).
#include <cstring>
#include <vector>

#include "backend/cpu/kernels/matmul.h"
#include "tessera/base/error.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/grouped_matmul.h"

namespace tessera {

namespace {

// sizes [G, E] (or [S, G, E], batches numbered s G + g) as row offsets:
// offsets[g * (E + 1) + e] = sizes[g, 0] + ... + sizes[g, e - 1].
std::vector<int64_t> group_offsets(const char* op, const Array& sizes, int64_t rows) {
  const int64_t e_count = sizes.shape(-1), g_count = sizes.shape(0) * (sizes.ndim() == 3 ? sizes.shape(1) : 1);
  std::vector<int64_t> offsets(static_cast<size_t>(g_count * (e_count + 1)));
  for (int64_t g = 0; g < g_count; ++g) {
    int64_t at = 0;
    for (int64_t e = 0; e < e_count; ++e) {
      const int64_t i = g * e_count + e;
      const int64_t n =
          sizes.dtype() == DType::Int32 ? static_cast<int64_t>(sizes.data<int32_t>()[i]) : sizes.data<int64_t>()[i];
      offsets[static_cast<size_t>(g * (e_count + 1) + e)] = at;
      if (n < 0) fail<ValueError>("{}: group {} of batch {} has {} rows (expected >= 0)", op, e, g, n);
      at += n;
      if (at > rows)
        fail<ValueError>("{}: the groups of batch {} hold {} rows or more, but the operand has {}", op, g, at, rows);
    }
    offsets[static_cast<size_t>(g * (e_count + 1) + e_count)] = at;
  }
  return offsets;
}

}  // namespace

void GroupedMatmul::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& a = inputs[0];
  const Array& w = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  // Batches g = s G + b of the S shards (S = 1 at rank 3); shard s multiplies its own
  // matrices w[s].
  const int64_t rows = a.shape(-2), k = a.shape(-1), m = out.shape(-1), e_count = w.shape(-3);
  const int64_t per_shard = a.shape(-3), g_count = a.ndim() == 4 ? a.shape(0) * per_shard : per_shard;
  const std::vector<int64_t> offsets = group_offsets("grouped_matmul", inputs[2], rows);
  const size_t item = itemsize(a.dtype());
  const auto* a_bytes = static_cast<const char*>(a.raw_data());
  const auto* w_bytes = static_cast<const char*>(w.raw_data());
  auto* out_bytes = static_cast<char*>(out.mutable_raw_data());
  for (int64_t g = 0; g < g_count; ++g) {
    const int64_t* off = &offsets[static_cast<size_t>(g * (e_count + 1))];
    for (int64_t e = 0; e < e_count; ++e) {
      const int64_t n = off[e + 1] - off[e];
      if (n == 0) continue;
      cpu::MatmulShape s;
      s.m = n;
      s.n = m;
      s.k = k;
      s.trans_b = trans_w_;
      const int64_t row = g * rows + off[e];
      cpu::matmul(a.dtype(), s, a_bytes + static_cast<size_t>(row * k) * item,
                  w_bytes + static_cast<size_t>(((g / per_shard) * e_count + e) * k * m) * item,
                  out_bytes + static_cast<size_t>(row * m) * item);
    }
    // Rows past the last group.
    const int64_t used = off[e_count];
    std::memset(out_bytes + static_cast<size_t>((g * rows + used) * m) * item, 0,
                static_cast<size_t>((rows - used) * m) * item);
  }
}

void GroupedMatmulWeightGrad::eval_cpu(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Array& x = inputs[0];
  const Array& y = inputs[1];
  Array& out = outputs[0];
  out.allocate();
  // Shard s (S = 1 at rank 3) adds its own batches s G .. s G + G - 1 into out[s].
  const int64_t rows = x.shape(-2), k = x.shape(-1), m = y.shape(-1), e_count = groups_;
  const int64_t shards = x.ndim() == 4 ? x.shape(0) : 1, per_shard = x.shape(-3);
  const std::vector<int64_t> offsets = group_offsets("grouped_matmul_weight_grad", inputs[2], rows);
  const size_t item = itemsize(x.dtype());
  const auto* x_bytes = static_cast<const char*>(x.raw_data());
  const auto* y_bytes = static_cast<const char*>(y.raw_data());
  auto* out_bytes = static_cast<char*>(out.mutable_raw_data());
  const size_t block = static_cast<size_t>(k * m);
  std::vector<char> partial;
  for (int64_t se = 0; se < shards * e_count; ++se) {
    const int64_t e = se % e_count, first = se / e_count * per_shard;
    char* dst = out_bytes + static_cast<size_t>(se) * block * item;
    bool written = false;
    for (int64_t g = first; g < first + per_shard; ++g) {
      const int64_t* off = &offsets[static_cast<size_t>(g * (e_count + 1))];
      const int64_t n = off[e + 1] - off[e];
      if (n == 0) continue;
      // [K, M] = x_rows^T y_rows, or [M, K] = y_rows^T x_rows: A stored [rows, .] is trans_a.
      cpu::MatmulShape s;
      s.m = trans_out_ ? m : k;
      s.n = trans_out_ ? k : m;
      s.k = n;
      s.trans_a = true;
      const int64_t row = g * rows + off[e];
      const char* xr = x_bytes + static_cast<size_t>(row * k) * item;
      const char* yr = y_bytes + static_cast<size_t>(row * m) * item;
      if (written) partial.resize(block * item);
      char* target = written ? partial.data() : dst;
      cpu::matmul(x.dtype(), s, trans_out_ ? yr : xr, trans_out_ ? xr : yr, target);
      if (written) add_into(dst, partial.data(), block, x.dtype());
      written = true;
    }
    if (!written) std::memset(dst, 0, block * item);
  }
}

}  // namespace tessera
