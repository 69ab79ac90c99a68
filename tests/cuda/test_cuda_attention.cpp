// Flash attention on the GPU (backend/cuda/kernels/flash_attention*.cu,
// backend/cuda/eval_attention.cpp) against the CPU backend's flash kernels, forward (out,
// lse) and backward (dq, dk, dv), on fresh random inputs:
//  * launcher level: sequence lengths 1, 7, 65, 200, 1024 (not multiples of the 64-row
//    tiles), head_dim 64, 128 (tensor-core kernels for bf16/f16) and 32, 80 (fp32
//    kernels), causal and not, T != S, grouped-query attention (H = 8, Hkv = 2), masks
//    (per head and broadcast, with fully masked rows), segment ids (packed documents), no
//    keys; float32 (1e-5), bfloat16 and float16 (1e-2; the CPU reference reads the same
//    rounded inputs). 16-bit dtypes run
//    both the tensor-core kernels (Auto) and the fp32 kernels (Generic), so a failure
//    names the kernel. The backward's inputs (out, lse) are the CPU forward's, so the two
//    directions are checked separately. Outputs are poisoned with NaN first.
//  * op level (run_on_gpu): the registered "attention" / "attention_grad" kernels.
//  * the backward is deterministic: two runs are bitwise equal.
//  * both generations of tensor-core kernels (TESSERA_ATTENTION_KERNEL = v2, the default,
//    and v1) run every 16-bit case; V2Shapes adds lengths 1, 17, 64, 127, 1024, 2048
//    with batch x heads not a multiple of anything, bf16 and f16, D = 64 and 128;
//    FragmentPatterns checks the v2 kernels' ldmatrix lane patterns on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/kernels/attention.h"
#include "backend/cuda/kernels/flash_attention.h"
#include "backend/cuda/kernels/flash_attention_fragments.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/attention_test_util.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/nn.h"

namespace ts = tessera;
using namespace ts::cuda_test::attention;  // NOLINT(google-build-using-namespace): the shared test helpers

namespace {

// Every path that applies: Auto, and for 16-bit dtypes Auto with both generations of
// tensor-core kernels and the fp32 kernels.
void check_problem(const Problem& pr, DType dtype) {
  const Case c = make_case(pr, dtype);
  if (!is_half(dtype)) {
    check_case(c, FlashAttentionPath::Auto);
    return;
  }
  for (const char* version : {"v2", "v1"}) {
    KernelFlag flag(version);
    check_case(c, FlashAttentionPath::Auto);
  }
  check_case(c, FlashAttentionPath::Generic);
}

}  // namespace

TEST(CudaAttention, SequenceLengthsHeadDim64) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (int64_t t : {1, 7, 65, 200, 1024})
      for (bool causal : {true, false}) {
        Problem pr;
        pr.T = pr.S = t;
        pr.causal = causal;
        check_problem(pr, dtype);
      }
}

TEST(CudaAttention, HeadDims) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (int64_t d : {128, 32, 80})
      for (int64_t t : {7, 65, 200})
        for (bool causal : {true, false}) {
          Problem pr;
          pr.T = pr.S = t;
          pr.D = d;
          pr.causal = causal;
          check_problem(pr, dtype);
        }
}

TEST(CudaAttention, GroupedQueryAttention) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16})
    for (int64_t d : {64, 128})
      for (bool causal : {true, false}) {
        Problem pr;
        pr.B = 2;
        pr.H = 8;
        pr.Hkv = 2;
        pr.T = pr.S = 130;
        pr.D = d;
        pr.causal = causal;
        check_problem(pr, dtype);
      }
}

TEST(CudaAttention, QueryAndKeyLengthsDiffer) {
  TESSERA_REQUIRE_GPU();
  // Causal is top-left aligned (query t sees keys s <= t): S < T leaves late queries
  // with all keys, S > T leaves late keys unseen (zero dK, dV).
  const int64_t lengths[][2] = {{7, 200}, {200, 7}, {65, 130}, {130, 65}, {1, 64}, {64, 1}};
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (const auto& ts_pair : lengths)
      for (bool causal : {true, false}) {
        Problem pr;
        pr.T = ts_pair[0];
        pr.S = ts_pair[1];
        pr.causal = causal;
        check_problem(pr, dtype);
      }
}

TEST(CudaAttention, Masked) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (Mask mask : {Mask::PerHead, Mask::Broadcast})
      for (int64_t d : {64, 80})
        for (bool causal : {true, false}) {
          Problem pr;
          pr.B = 2;
          pr.H = 4;
          pr.Hkv = 2;
          pr.T = 65;
          pr.S = 70;
          pr.D = d;
          pr.causal = causal;
          pr.mask = mask;
          check_problem(pr, dtype);
        }
}

TEST(CudaAttention, PackedDocuments) {
  TESSERA_REQUIRE_GPU();
  // Segment ids (T == S): the fp32 CUDA-core kernels on every path.
  for (DType dtype : {DType::Float32, DType::BFloat16})
    for (bool causal : {true, false}) {
      Problem pr;
      pr.B = 2;
      pr.H = 4;
      pr.Hkv = 2;
      pr.T = pr.S = 150;
      pr.D = 64;
      pr.causal = causal;
      pr.documents = 4;
      check_problem(pr, dtype);
    }
}

TEST(CudaAttention, NoKeys) {
  TESSERA_REQUIRE_GPU();
  // S = 0: out = 0, lse = -inf, dq = 0 (and nothing to write for dk, dv).
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    Problem pr;
    pr.T = 9;
    pr.S = 0;
    pr.causal = false;
    check_problem(pr, dtype);
  }
}

TEST(CudaAttention, TensorCoresApply) {
  TESSERA_REQUIRE_GPU();
  // The fast kernels are the ones the sweeps above exercise under Auto.
  ts::cuda::FlashAttentionShape s;
  s.head_dim = 64;
  EXPECT_TRUE(ts::cuda::flash_attention_uses_tensor_cores(DType::BFloat16, s));
  EXPECT_TRUE(ts::cuda::flash_attention_uses_tensor_cores(DType::Float16, s));
  EXPECT_FALSE(ts::cuda::flash_attention_uses_tensor_cores(DType::Float32, s));
  s.head_dim = 128;
  EXPECT_TRUE(ts::cuda::flash_attention_uses_tensor_cores(DType::BFloat16, s));
  s.head_dim = 80;
  EXPECT_FALSE(ts::cuda::flash_attention_uses_tensor_cores(DType::BFloat16, s));
}

TEST(CudaAttention, BackwardIsDeterministic) {
  TESSERA_REQUIRE_GPU();
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    Problem pr;
    pr.B = 2;
    pr.H = 8;
    pr.Hkv = 2;
    pr.T = pr.S = 300;
    const Case c = make_case(pr, dtype);
    const GpuGrads a = check_case(c, FlashAttentionPath::Auto);
    const GpuGrads b = check_case(c, FlashAttentionPath::Auto);
    EXPECT_TRUE(a.dq == b.dq && a.dk == b.dk && a.dv == b.dv) << pr.str(dtype);
  }
}

TEST(CudaAttention, V2Shapes) {
  TESSERA_REQUIRE_GPU();
  // Lengths around the v2 tiles (128 queries x 64 or 32 keys): 1, 17, 64, 127 with 3 x 5
  // (batch, heads), and 1024, 2048 (GPT-2's and twice it) with 1 x 3, so that the
  // grid is no multiple of the SM count or of a wave.
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (int64_t d : {64, 128})
      for (int64_t t : {1, 17, 64, 127, 1024, 2048})
        for (bool causal : {true, false}) {
          Problem pr;
          pr.B = t >= 1024 ? 1 : 3;
          pr.H = pr.Hkv = t >= 1024 ? 3 : 5;
          pr.T = pr.S = t;
          pr.D = d;
          pr.causal = causal;
          check_problem(pr, dtype);
        }
}

TEST(CudaAttention, V2IsDeterministic) {
  TESSERA_REQUIRE_GPU();
  // Forward and backward twice on the same inputs: bitwise equal (no atomics, one order
  // of every sum).
  KernelFlag flag("v2");
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (bool causal : {true, false}) {
      Problem pr;
      pr.B = 2;
      pr.H = 6;
      pr.Hkv = 3;
      pr.T = pr.S = 333;
      pr.causal = causal;
      const Case c = make_case(pr, dtype);
      const GpuGrads a = check_case(c, FlashAttentionPath::Auto);
      const GpuGrads b = check_case(c, FlashAttentionPath::Auto);
      const bool lse_equal =
          a.lse.size() == b.lse.size() && std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
      EXPECT_TRUE(a.out == b.out && lse_equal) << pr.str(dtype) << ": forward";
      EXPECT_TRUE(a.dq == b.dq && a.dk == b.dk && a.dv == b.dv) << pr.str(dtype) << ": backward";
    }
}

TEST(CudaAttention, KernelFlagValues) {
  // No GPU needed: the flag is read on the host.
  {
    KernelFlag flag("v1");
    EXPECT_EQ(ts::cuda::flash_attention_kernel(), ts::cuda::FlashAttentionKernel::V1);
  }
  {
    KernelFlag flag("v2");
    EXPECT_EQ(ts::cuda::flash_attention_kernel(), ts::cuda::FlashAttentionKernel::V2);
  }
  {
    KernelFlag flag("");  // empty = unset: the default
    EXPECT_EQ(ts::cuda::flash_attention_kernel(), ts::cuda::FlashAttentionKernel::V2);
  }
  for (const char* cudnn : {"auto", "cudnn"}) {  // cuDNN where it applies, v2 elsewhere
    KernelFlag flag(cudnn);
    EXPECT_EQ(ts::cuda::flash_attention_kernel(), ts::cuda::FlashAttentionKernel::V2) << cudnn;
  }
  {
    KernelFlag flag("v3");
    EXPECT_THROW(ts::cuda::flash_attention_kernel(), ts::ValueError);
  }
}

namespace {

// ldmatrix x4 on the host (flash_attention_fragments.h): lane l's register i of a tile
// of element ids, from the 32 lanes' (row, col) addresses. Plain: matrix i's row l / 4,
// elements 2 (l % 4), +1; .trans: matrix i's rows 2 (l % 4), +1, element l / 4.
using LaneFn = ts::cuda::flash::LaneRowCol (*)(int);
std::pair<int, int> ldmatrix_pair(LaneFn fn, bool trans, int lane, int i, int ld) {
  const auto address = [&](int row_of_matrix) {
    const ts::cuda::flash::LaneRowCol rc = fn(8 * i + row_of_matrix);
    return rc.row * ld + rc.col;
  };
  const int g = lane / 4, t = lane % 4;
  if (!trans) return {address(g) + 2 * t, address(g) + 2 * t + 1};
  return {address(2 * t) + g, address(2 * t + 1) + g};
}

}  // namespace

TEST(CudaAttention, FragmentPatterns) {
  // The v2 kernels' ldmatrix lane patterns give the mma.sync m16n8k16 fragments
  // (flash_attention_common.cuh) of a 16 x 16 block of a row-major tile with row stride
  // ld: element (r, c) has id r * ld + c. No GPU needed.
  namespace fl = ts::cuda::flash;
  const int ld = 72;
  const auto id = [&](int r, int c) { return r * ld + c; };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    // A = Q[m][k]: a[0] = A[g][2t..], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..].
    const std::pair<int, int> a[4] = {{id(g, 2 * t), id(g, 2 * t + 1)},
                                      {id(g + 8, 2 * t), id(g + 8, 2 * t + 1)},
                                      {id(g, 2 * t + 8), id(g, 2 * t + 9)},
                                      {id(g + 8, 2 * t + 8), id(g + 8, 2 * t + 9)}};
    // B[k][n] = K[n][k] for n-tiles 0, 1: b[0] = B[2t..][g] = K[g][2t..], b[1] = K[g][2t+8..].
    const std::pair<int, int> bk[4] = {{id(g, 2 * t), id(g, 2 * t + 1)},
                                       {id(g, 2 * t + 8), id(g, 2 * t + 9)},
                                       {id(g + 8, 2 * t), id(g + 8, 2 * t + 1)},
                                       {id(g + 8, 2 * t + 8), id(g + 8, 2 * t + 9)}};
    // B[k][n] = V[k][n] for n-tiles 0, 1: b[0] = V[2t..][g] (down a column), b[1] = V[2t+8..][g].
    const std::pair<int, int> bv[4] = {{id(2 * t, g), id(2 * t + 1, g)},
                                       {id(2 * t + 8, g), id(2 * t + 9, g)},
                                       {id(2 * t, g + 8), id(2 * t + 1, g + 8)},
                                       {id(2 * t + 8, g + 8), id(2 * t + 9, g + 8)}};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(ldmatrix_pair(fl::ldsm_a_lane, false, lane, i, ld), a[i]) << "A, lane " << lane << ", reg " << i;
      EXPECT_EQ(ldmatrix_pair(fl::ldsm_b_nk_lane, false, lane, i, ld), bk[i]) << "K, lane " << lane << ", reg " << i;
      EXPECT_EQ(ldmatrix_pair(fl::ldsm_b_kn_trans_lane, true, lane, i, ld), bv[i])
          << "V, lane " << lane << ", reg " << i;
    }
  }
}

TEST(CudaAttention, UnsupportedArguments) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::FlashAttentionShape s;
  s.q_len = s.kv_len = 4;
  s.head_dim = 300;
  EXPECT_THROW(
      ts::cuda::flash_attention_forward(DType::Float32, s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
      ts::ValueError);
  s.head_dim = 64;
  EXPECT_THROW(
      ts::cuda::flash_attention_forward(DType::Float64, s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
      ts::DTypeError);
}

// ---- op level: the registered kernels through run_on_gpu ----

TEST(CudaAttention, OpLevelForwardAndBackward) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::register_attention_kernels();  // also links eval_attention.o into this binary
  struct OpCase {
    DType dtype;
    int64_t h, hkv, t, s, d;
    bool causal, mask, segments;  // segments: packed documents (t == s)
  };
  const OpCase cases[] = {{DType::BFloat16, 8, 2, 200, 200, 64, true, false, false},
                          {DType::Float32, 4, 2, 65, 65, 64, true, false, false},
                          {DType::BFloat16, 2, 2, 33, 47, 128, false, false, false},
                          {DType::Float32, 2, 1, 40, 40, 80, true, true, false},
                          {DType::BFloat16, 2, 2, 40, 50, 64, false, true, false},
                          {DType::BFloat16, 4, 2, 130, 130, 64, true, false, true},
                          {DType::Float32, 2, 2, 40, 40, 80, false, true, true}};
  for (const OpCase& oc : cases) {
    const std::string what = std::string(ts::name(oc.dtype)) + " H=" + std::to_string(oc.h) +
                             " Hkv=" + std::to_string(oc.hkv) + " T=" + std::to_string(oc.t) +
                             " S=" + std::to_string(oc.s) + " D=" + std::to_string(oc.d) +
                             (oc.causal ? " causal" : "") + (oc.mask ? " mask" : "") + (oc.segments ? " segments" : "");
    Array q = random_array({2, oc.h, oc.t, oc.d}, oc.dtype);
    Array k = random_array({2, oc.hkv, oc.s, oc.d}, oc.dtype);
    Array v = random_array({2, oc.hkv, oc.s, oc.d}, oc.dtype);
    std::optional<Array> mask;
    if (oc.mask) {
      mask = ts::greater(random_array({1, oc.h, oc.t, oc.s}, DType::Float32), ts::zeros({}, DType::Float32));
      mask->eval();
    }
    std::optional<Array> segments;
    if (oc.segments) {  // documents of 1 to 64 tokens
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < 2 * oc.t; ++i) ids.push_back(static_cast<int32_t>((i % oc.t) * (i % oc.t) / 300));
      segments = Array::from_vector(ids, {2, oc.t});
    }
    Array y = ts::scaled_dot_product_attention(q, k, v, oc.causal, mask, std::nullopt, segments);
    // Read the graph before evaluating: an evaluated array no longer holds its primitive.
    const ts::AttentionConfig config = dynamic_cast<const ts::Attention&>(*y.primitive()).config();
    std::vector<Array> in = y.inputs();
    std::vector<Array> fwd = y.siblings();  // out, lse (CPU reference)
    std::vector<Array> gpu = ts::cuda::run_on_gpu(y);
    ts::eval(fwd);
    ASSERT_EQ(gpu.size(), 2u) << what;
    EXPECT_LT(rel_error_inf(values(gpu[0]), values(fwd[0])), tolerance(oc.dtype)) << what << ": out";
    EXPECT_LT(rel_error_inf(values(gpu[1]), values(fwd[1])), ts::cuda_test::kF32Tolerance) << what << ": lse";

    // attention_grad with the inputs the vjp rule gives it: q, k, v, [mask], [segments],
    // out, lse, dout.
    Array dout = random_array(q.shape(), oc.dtype);
    in.push_back(fwd[0]);
    in.push_back(fwd[1]);
    in.push_back(dout);
    std::vector<Array> grads = Array::make({q.shape(), k.shape(), v.shape()}, {oc.dtype, oc.dtype, oc.dtype},
                                           std::make_shared<ts::AttentionGrad>(config), in);
    std::vector<Array> gpu_grads = ts::cuda::run_on_gpu(grads[0]);
    ts::eval(grads);
    ASSERT_EQ(gpu_grads.size(), 3u) << what;
    for (int i = 0; i < 3; ++i)
      EXPECT_LT(ts::cuda_test::rel_error(values(gpu_grads[i]), values(grads[i])), tolerance(oc.dtype)) << what << ": d"
                                                                                                       << "qkv"[i];
  }
}

// attention_packed / attention_packed_grad (made by the attention-layout pass): q, k, v
// read in place from qkv [B, T, Hkv, G + 2, D], out and dout [B, T, H, D], dqkv written in
// place. Against the CPU (the packed CPU eval, which runs the unpacked kernels) within the
// dtype's tolerance, and bitwise against the unpacked GPU op on the unpacked tensors (the
// same kernels reading other addresses), on the v2 path and on the fallback's copies (v1,
// float32, D = 80).
TEST(CudaAttention, PackedQkvInPlace) {
  TESSERA_REQUIRE_GPU();
  ts::cuda::register_attention_kernels();
  struct PackedCase {
    DType dtype;
    int64_t hkv, g, t, d;
    bool segments;
    const char* kernel;  // TESSERA_ATTENTION_KERNEL
  };
  const PackedCase cases[] = {
      {DType::BFloat16, 3, 1, 200, 64, false, "v2"}, {DType::BFloat16, 2, 2, 130, 128, false, "v2"},
      {DType::Float16, 2, 3, 77, 64, true, "v2"},    {DType::BFloat16, 3, 1, 100, 64, false, "v1"},
      {DType::Float32, 2, 2, 40, 80, false, "v2"},   {DType::BFloat16, 2, 1, 64, 64, true, "v1"}};
  for (const PackedCase& pc : cases) {
    const int64_t b = 2, h = pc.hkv * pc.g;
    const std::string what = std::string(ts::name(pc.dtype)) + " Hkv=" + std::to_string(pc.hkv) +
                             " G=" + std::to_string(pc.g) + " T=" + std::to_string(pc.t) +
                             " D=" + std::to_string(pc.d) + (pc.segments ? " segments " : " ") + pc.kernel;
    ::setenv("TESSERA_ATTENTION_KERNEL", pc.kernel, 1);
    const ts::AttentionConfig config{.causal = true, .scale = 0.125, .has_mask = false, .has_segments = pc.segments};
    Array qkv = random_array({b, pc.t, pc.hkv, pc.g + 2, pc.d}, pc.dtype);
    std::vector<Array> in;
    in.reserve(2);
    in.push_back(qkv);
    if (pc.segments) {
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < b * pc.t; ++i) ids.push_back(static_cast<int32_t>((i % pc.t) / 23));
      in.push_back(Array::from_vector(ids, {b, pc.t}));
    }
    std::vector<Array> fwd = Array::make({{b, pc.t, h, pc.d}, {b, h, pc.t}}, {pc.dtype, DType::Float32},
                                         std::make_shared<ts::AttentionPacked>(config), in);
    std::vector<Array> gpu = ts::cuda::run_on_gpu(fwd[0]);
    ts::eval(fwd);
    ASSERT_EQ(gpu.size(), 2u) << what;
    EXPECT_LT(rel_error_inf(values(gpu[0]), values(fwd[0])), tolerance(pc.dtype)) << what << ": out";
    EXPECT_LT(rel_error_inf(values(gpu[1]), values(fwd[1])), ts::cuda_test::kF32Tolerance) << what << ": lse";

    Array dout = random_array({b, pc.t, h, pc.d}, pc.dtype);
    std::vector<Array> grad_in = in;
    grad_in.push_back(fwd[0]);
    grad_in.push_back(fwd[1]);
    grad_in.push_back(dout);
    Array dqkv = Array::make(qkv.shape(), pc.dtype, std::make_shared<ts::AttentionPackedGrad>(config), grad_in);
    std::vector<Array> gpu_dqkv = ts::cuda::run_on_gpu(dqkv);
    dqkv.eval();
    EXPECT_LT(ts::cuda_test::rel_error(values(gpu_dqkv[0]), values(dqkv)), tolerance(pc.dtype)) << what << ": dqkv";

    // The unpacked op on the GPU, on the same (CPU-unpacked) values: bitwise equal.
    auto heads_first = [&](const Array& x, int64_t start, int64_t stop, int64_t n) {
      return ts::transpose(ts::reshape(ts::slice_axis(x, 3, start, stop), {b, pc.t, n, pc.d}), {0, 2, 1, 3}).eval();
    };
    std::vector<Array> plain_in = {heads_first(qkv, 0, pc.g, h), heads_first(qkv, pc.g, pc.g + 1, pc.hkv),
                                   heads_first(qkv, pc.g + 1, pc.g + 2, pc.hkv)};
    if (pc.segments) plain_in.push_back(in[1]);
    std::vector<Array> plain = Array::make({plain_in[0].shape(), {b, h, pc.t}}, {pc.dtype, DType::Float32},
                                           std::make_shared<ts::Attention>(config), plain_in);
    std::vector<Array> gpu_plain = ts::cuda::run_on_gpu(plain[0]);
    const Array packed_out = ts::transpose(gpu[0], {0, 2, 1, 3}).eval();
    EXPECT_EQ(values(packed_out), values(gpu_plain[0])) << what << ": out vs the unpacked op";
    EXPECT_EQ(values(gpu[1]), values(gpu_plain[1])) << what << ": lse vs the unpacked op";
  }
  ::unsetenv("TESSERA_ATTENTION_KERNEL");
}
