// cuDNN's fused attention (backend/cuda/kernels/cudnn_attention.h) against the CPU
// backend's flash kernels, as test_cuda_attention.cpp checks tessera's own:
//  * launcher level: forward (out, lse) and backward (dq, dk, dv) on random problems
//    (bf16 and f16, head_dim 64 and 128, causal and not, T != S, grouped-query heads,
//    lengths that are not multiples of any tile, one query), within the same tolerances;
//    cuDNN must accept each of these problems (a refusal fails the test, naming cuDNN's
//    reason); the backward of one query and one key, which it refuses, falls back.
//  * the backward runs cuDNN's deterministic algorithm: two runs are bitwise equal.
//  * op level: the packed primitives under TESSERA_ATTENTION_KERNEL=cudnn, in place in
//    the fused qkv layout (H == Hkv) and through the fallback (H = 2 Hkv), against the CPU.
//  * the library's status and the flag: cuDNN by default where it loaded, an error for
//    "cudnn" where it did not (no GPU needed).
// Without a GPU or without cuDNN the device tests skip and say why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernels/cudnn_attention.h"
#include "backend/cuda/run_on_gpu.h"
#include "cuda/attention_test_util.h"
#include "cuda/cuda_test_util.h"
#include "tessera/ir/primitives/nn.h"

namespace ts = tessera;
using namespace ts::cuda_test::attention;  // NOLINT(google-build-using-namespace): the shared test helpers

#define TESSERA_REQUIRE_CUDNN()                                                                              \
  do {                                                                                                       \
    TESSERA_REQUIRE_GPU();                                                                                   \
    if (!ts::cuda::cudnn_library().loaded) GTEST_SKIP() << "no cuDNN: " << ts::cuda::cudnn_library().reason; \
  } while (0)

namespace {

// A workspace that grows on request (the caller's side of CudnnWorkspace).
class Workspace {
 public:
  ts::cuda::CudnnWorkspace fn() {
    return [this](size_t bytes) {
      if (bytes > bytes_) {
        buffer_ = std::make_unique<DeviceBuffer<unsigned char>>(bytes);
        bytes_ = bytes;
      }
      return static_cast<void*>(buffer_->get());
    };
  }

 private:
  std::unique_ptr<DeviceBuffer<unsigned char>> buffer_;
  size_t bytes_ = 0;
};

// cuDNN on dense layouts; a launch cuDNN refuses fails the test.
AttentionLaunch cudnn_launch(DType dtype, const std::shared_ptr<Workspace>& ws) {
  AttentionLaunch l;
  l.label = " [cudnn]";
  l.forward = [dtype, ws](const FlashAttentionShape& s, const void* q, const void* k, const void* v, void* out,
                          float* lse) {
    EXPECT_TRUE(ts::cuda::cudnn_attention_forward(dtype, s, ts::cuda::contiguous_attention_layout(s), q, k, v, out, lse,
                                                  ws->fn(), nullptr))
        << "cuDNN refused the forward (its reason is on stderr)";
  };
  l.backward = [dtype, ws](const FlashAttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                           const float* lse, const void* dout, void* dq, void* dk, void* dv) {
    EXPECT_TRUE(ts::cuda::cudnn_attention_backward(dtype, s, ts::cuda::contiguous_attention_layout(s), q, k, v, out,
                                                   lse, dout, dq, dk, dv, ws->fn(), nullptr))
        << "cuDNN refused the backward (its reason is on stderr)";
  };
  return l;
}

// Sets or clears TESSERA_ATTENTION_KERNEL for its lifetime.
class FlagScope {
 public:
  explicit FlagScope(const char* value) { ::setenv("TESSERA_ATTENTION_KERNEL", value, 1); }
  ~FlagScope() { ::unsetenv("TESSERA_ATTENTION_KERNEL"); }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;
};

}  // namespace

TEST(CudnnAttention, MatchesTheCpuReference) {
  TESSERA_REQUIRE_CUDNN();
  auto ws = std::make_shared<Workspace>();
  const std::vector<Problem> problems = {
      {.B = 2, .H = 4, .Hkv = 4, .T = 1024, .S = 1024, .D = 64},  // GPT-2's head_dim and length
      {.B = 2, .H = 3, .Hkv = 3, .T = 65, .S = 65, .D = 128},
      {.B = 1, .H = 2, .Hkv = 2, .T = 200, .S = 200, .D = 64, .causal = false},
      {.B = 2, .H = 2, .Hkv = 2, .T = 7, .S = 130, .D = 64},                 // T != S, top-left causal
      {.B = 1, .H = 8, .Hkv = 2, .T = 256, .S = 256, .D = 64},               // grouped-query
      {.B = 3, .H = 2, .Hkv = 2, .T = 1, .S = 9, .D = 64, .causal = false},  // one query
  };
  for (DType dtype : {DType::BFloat16, DType::Float16})
    for (const Problem& p : problems) check_case(make_case(p, dtype), cudnn_launch(dtype, ws));
}

// cuDNN's backward refuses one query and one key: the launcher says so before asking
// (launching nothing), and the attention evals then run tessera's kernels.
TEST(CudnnAttention, TheBackwardOfOneQueryAndOneKeyFallsBack) {
  TESSERA_REQUIRE_CUDNN();
  FlashAttentionShape s;
  s.batch = 3;
  s.heads = s.kv_heads = 2;
  s.q_len = s.kv_len = 1;
  s.head_dim = 64;
  s.causal = true;
  s.scale = 0.125;
  const size_t n = 3 * 2 * 64;
  DeviceBuffer<uint16_t> q(n), k(n), v(n), out(n), dout(n), dq(n), dk(n), dv(n);
  DeviceBuffer<float> lse(6);
  for (auto* b : {&dq, &dk, &dv}) b->poison();
  Workspace ws;
  EXPECT_FALSE(ts::cuda::cudnn_attention_backward(DType::BFloat16, s, ts::cuda::contiguous_attention_layout(s), q.get(),
                                                  k.get(), v.get(), out.get(), lse.get(), dout.get(), dq.get(),
                                                  dk.get(), dv.get(), ws.fn(), nullptr));
  for (auto* b : {&dq, &dk, &dv})
    for (uint16_t bits : b->download()) ASSERT_EQ(bits, 0xFFFF) << "the refused backward wrote";
}

TEST(CudnnAttention, BackwardIsBitwiseDeterministic) {
  TESSERA_REQUIRE_CUDNN();
  const Case c = make_case({.B = 2, .H = 12, .Hkv = 12, .T = 1024, .S = 1024, .D = 64}, DType::BFloat16);
  auto ws = std::make_shared<Workspace>();
  const GpuGrads a = check_case(c, cudnn_launch(DType::BFloat16, ws));
  const GpuGrads b = check_case(c, cudnn_launch(DType::BFloat16, ws));
  EXPECT_TRUE(a.out == b.out && a.lse == b.lse) << "forward differs between two runs";
  EXPECT_TRUE(a.dq == b.dq) << "dq differs between two runs";
  EXPECT_TRUE(a.dk == b.dk && a.dv == b.dv) << "dk/dv differ between two runs";
}

// The packed primitives with TESSERA_ATTENTION_KERNEL=cudnn: in place where the layout
// fits cuDNN (G = 1), tessera's kernels where it does not (G = 2); both within the
// dtype's tolerance of the CPU.
TEST(CudnnAttention, PackedOpsMatchTheCpu) {
  TESSERA_REQUIRE_CUDNN();
  ts::cuda::register_attention_kernels();
  FlagScope flag("cudnn");
  struct PackedCase {
    DType dtype;
    int64_t hkv, g, t, d;
  };
  const PackedCase cases[] = {
      {DType::BFloat16, 12, 1, 1024, 64}, {DType::Float16, 3, 1, 130, 128}, {DType::BFloat16, 2, 2, 77, 64}};
  for (const PackedCase& pc : cases) {
    const int64_t b = 2, h = pc.hkv * pc.g;
    const std::string what = std::string(ts::name(pc.dtype)) + " Hkv=" + std::to_string(pc.hkv) +
                             " G=" + std::to_string(pc.g) + " T=" + std::to_string(pc.t) + " D=" + std::to_string(pc.d);
    const ts::AttentionConfig config{.causal = true, .scale = 0.125, .has_mask = false, .has_segments = false};
    Array qkv = random_array({b, pc.t, pc.hkv, pc.g + 2, pc.d}, pc.dtype);
    std::vector<Array> fwd = Array::make({{b, pc.t, h, pc.d}, {b, h, pc.t}}, {pc.dtype, DType::Float32},
                                         std::make_shared<ts::AttentionPacked>(config), {qkv});
    std::vector<Array> gpu = ts::cuda::run_on_gpu(fwd[0]);
    ts::eval(fwd);
    ASSERT_EQ(gpu.size(), 2u) << what;
    EXPECT_LT(rel_error_inf(values(gpu[0]), values(fwd[0])), tolerance(pc.dtype, pc.t)) << what << ": out";
    EXPECT_LT(rel_error_inf(values(gpu[1]), values(fwd[1])), ts::cuda_test::kF32Tolerance) << what << ": lse";

    Array dout = random_array({b, pc.t, h, pc.d}, pc.dtype);
    Array dqkv = Array::make(qkv.shape(), pc.dtype, std::make_shared<ts::AttentionPackedGrad>(config),
                             {qkv, fwd[0], fwd[1], dout});
    std::vector<Array> gpu_dqkv = ts::cuda::run_on_gpu(dqkv);
    dqkv.eval();
    EXPECT_LT(ts::cuda_test::rel_error(values(gpu_dqkv[0]), values(dqkv)), tolerance(pc.dtype, pc.t))
        << what << ": dqkv";
  }
}

TEST(CudnnAttention, LibraryStatusAndFlag) {
  // No GPU needed: opening the library and reading the flag happen on the host.
  const ts::cuda::CudnnLibrary& lib = ts::cuda::cudnn_library();
  const std::string description = ts::cuda::cudnn_description();
  if (lib.loaded) {
    EXPECT_GE(lib.version, 90000);
    EXPECT_FALSE(lib.path.empty());
    EXPECT_TRUE(lib.reason.empty());
    EXPECT_EQ(description.find("not used"), std::string::npos) << description;
  } else {
    EXPECT_FALSE(lib.reason.empty());
    EXPECT_EQ(description, "not used: " + lib.reason);
  }
  {
    FlagScope flag("v2");
    EXPECT_FALSE(ts::cuda::cudnn_attention_selected());
  }
  {
    FlagScope flag("cudnn");
    if (lib.loaded) {
      EXPECT_TRUE(ts::cuda::cudnn_attention_selected());
    } else {
      try {
        ts::cuda::cudnn_attention_selected();
        ADD_FAILURE() << "TESSERA_ATTENTION_KERNEL=cudnn without cuDNN must be an error";
      } catch (const ts::Error& e) {
        EXPECT_NE(std::string(e.what()).find(lib.reason), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(ts::cuda::flash_attention_kernel(), ts::cuda::FlashAttentionKernel::V2);  // the fallback
  }
  for (const char* automatic : {"", "auto"}) {  // the default: cuDNN wherever it loaded
    FlagScope flag(automatic);
    EXPECT_EQ(ts::cuda::cudnn_attention_selected(), lib.loaded) << "'" << automatic << "'";
  }
  ::unsetenv("TESSERA_ATTENTION_KERNEL");
  EXPECT_EQ(ts::cuda::cudnn_attention_selected(), lib.loaded);
}
