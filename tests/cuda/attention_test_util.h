// Shared by the CUDA attention tests (test_cuda_attention.cpp: tessera's kernels;
// test_cuda_cudnn_attention.cpp: cuDNN's): random problems, the CPU backend's flash
// kernels as the reference (make_case), the tolerances, and check_case, which runs one
// implementation's forward and backward on the GPU and compares every output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/kernels/attention.h"
#include "backend/cuda/kernels/flash_attention.h"
#include "cuda/cuda_test_util.h"
#include "tessera/core/ops.h"

namespace tessera::cuda {
void register_attention_kernels();  // eval_attention.cpp: the op-level tests register them
}  // namespace tessera::cuda

// The tests use these names unqualified (`using namespace tessera::cuda_test::attention`).
namespace tessera::cuda_test::attention {

namespace ts = tessera;
using ts::Array;
using ts::DType;
using ts::Shape;
using ts::cuda::FlashAttentionPath;
using ts::cuda::FlashAttentionShape;
using ts::cuda_test::DeviceBuffer;

inline uint64_t next_seed() {
  static uint64_t seed = 7000;
  return ++seed;
}

inline bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

// Relative (norm-wise) error bound for results of sums over n terms (n = the longer of
// the two sequence lengths). Both backends read the same rounded inputs and accumulate
// in float32; the GPU also rounds P and dS to the 16-bit dtype (relative 2^-9 for bf16)
// to feed the tensor cores. For independent rounding errors the relative error of a sum
// stays near 2^-9 whatever n (numerator and norm both grow like sqrt(n)); the bound
// allows, beyond n = 1024, a random-walk growth sqrt(n / 1024) on top of the 1e-2
// (about 5x the expected 16-bit error) that holds for short rows, in case the errors of
// long rows correlate (causal rows put much weight on few keys).
inline double tolerance(DType d, int64_t n = 1) {
  const double growth = std::sqrt(std::max(1.0, static_cast<double>(n) / 1024.0));
  return (is_half(d) ? ts::cuda_test::kBf16Tolerance : ts::cuda_test::kF32Tolerance) * growth;
}

// Sets TESSERA_ATTENTION_KERNEL for its lifetime (the launchers read it on every call)
// and restores the previous value.
class KernelFlag {
 public:
  explicit KernelFlag(const char* value) {
    const char* old = std::getenv(kName);
    if (old != nullptr) saved_ = old;
    ::setenv(kName, value, 1);
  }
  ~KernelFlag() {
    if (saved_) {
      ::setenv(kName, saved_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }
  KernelFlag(const KernelFlag&) = delete;
  KernelFlag& operator=(const KernelFlag&) = delete;

 private:
  static constexpr const char* kName = "TESSERA_ATTENTION_KERNEL";
  std::optional<std::string> saved_;
};

inline const char* kernel_label(FlashAttentionPath path) {
  if (path == FlashAttentionPath::Generic) return " [generic]";
  return ts::cuda::flash_attention_kernel() == ts::cuda::FlashAttentionKernel::V1 ? " [auto v1]" : " [auto v2]";
}

// Host values stored in `dtype` (raw bytes, what both backends read).
struct Host {
  DType dtype = DType::Float32;
  std::vector<unsigned char> bytes;
};

inline Host to_host(const std::vector<float>& v, DType dtype) {
  Host h;
  h.dtype = dtype;
  h.bytes.resize(v.size() * ts::itemsize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::Float32) {
      std::memcpy(h.bytes.data() + 4 * i, &v[i], 4);
    } else if (dtype == DType::BFloat16) {
      const ts::bfloat16 b = ts::float_to_bf16(v[i]);
      std::memcpy(h.bytes.data() + 2 * i, &b, 2);
    } else {
      const ts::float16 f = ts::float_to_f16(v[i]);
      std::memcpy(h.bytes.data() + 2 * i, &f, 2);
    }
  }
  return h;
}

inline std::vector<float> to_floats(const std::vector<unsigned char>& bytes, DType dtype) {
  const size_t n = bytes.size() / ts::itemsize(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::Float32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else if (dtype == DType::BFloat16) {
      ts::bfloat16 b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = ts::bf16_to_float(b);
    } else {
      ts::float16 f;
      std::memcpy(&f, bytes.data() + 2 * i, 2);
      out[i] = ts::f16_to_float(f);
    }
  }
  return out;
}

inline Host random_host(int64_t n, DType dtype) {
  return to_host(ts::cuda_test::random_floats(static_cast<size_t>(n), next_seed()), dtype);
}

// rel_error, except that infinite reference entries (lse of rows with no visible key)
// must be matched exactly and are left out of the norm.
inline double rel_error_inf(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  std::vector<float> o, r;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isinf(ref[i])) {
      if (out[i] != ref[i]) return INFINITY;
      continue;
    }
    o.push_back(out[i]);
    r.push_back(ref[i]);
  }
  return ts::cuda_test::rel_error(o, r);
}

inline double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::isfinite(v) ? std::max(m, static_cast<double>(std::fabs(v))) : INFINITY;
  return m;
}

enum class Mask { None, PerHead, Broadcast };

struct Problem {
  int64_t B = 1, H = 2, Hkv = 2, T = 1, S = 1, D = 64;
  bool causal = true;
  Mask mask = Mask::None;
  int64_t documents = 0;  // > 0: segment ids, T == S tokens packed as this many documents

  std::string str(DType dtype) const {
    return std::string(ts::name(dtype)) + " B=" + std::to_string(B) + " H=" + std::to_string(H) +
           " Hkv=" + std::to_string(Hkv) + " T=" + std::to_string(T) + " S=" + std::to_string(S) +
           " D=" + std::to_string(D) + (causal ? " causal" : "") +
           (mask == Mask::PerHead     ? " mask[B,H,T,S]"
            : mask == Mask::Broadcast ? " mask[1,1,T,S]"
                                      : "") +
           (documents > 0 ? " documents=" + std::to_string(documents) : "");
  }
};

// One problem's inputs, the CPU results, and device copies of the inputs.
struct Case {
  Problem pr;
  DType dtype;
  Host q, k, v, dout;
  std::vector<uint8_t> mask;
  int64_t mask_b_stride = 0, mask_h_stride = 0;
  std::vector<int32_t> segments;   // [B, T] or empty
  std::vector<unsigned char> out;  // CPU forward (dtype)
  std::vector<float> lse;          // CPU forward
  std::vector<unsigned char> dq, dk, dv;

  ts::cpu::AttentionShape cpu_shape() const {
    ts::cpu::AttentionShape s;
    s.batch = pr.B;
    s.heads = pr.H;
    s.kv_heads = pr.Hkv;
    s.q_len = pr.T;
    s.kv_len = pr.S;
    s.head_dim = pr.D;
    s.causal = pr.causal;
    s.scale = pr.D > 0 ? 1.0 / std::sqrt(static_cast<double>(pr.D)) : 1.0;
    s.mask = mask.empty() ? nullptr : mask.data();
    s.mask_b_stride = mask_b_stride;
    s.mask_h_stride = mask_h_stride;
    s.segments = segments.empty() ? nullptr : segments.data();
    return s;
  }
  ts::cuda::FlashAttentionShape gpu_shape(const void* device_mask, const int32_t* device_segments) const {
    const ts::cpu::AttentionShape c = cpu_shape();
    ts::cuda::FlashAttentionShape s;
    s.batch = c.batch;
    s.heads = c.heads;
    s.kv_heads = c.kv_heads;
    s.q_len = c.q_len;
    s.kv_len = c.kv_len;
    s.head_dim = c.head_dim;
    s.causal = c.causal;
    s.scale = c.scale;
    s.mask = device_mask;
    s.mask_b_stride = c.mask_b_stride;
    s.mask_h_stride = c.mask_h_stride;
    s.segments = device_segments;
    return s;
  }
};

inline Case make_case(const Problem& pr, DType dtype) {
  Case c;
  c.pr = pr;
  c.dtype = dtype;
  const int64_t q_n = pr.B * pr.H * pr.T * pr.D, kv_n = pr.B * pr.Hkv * pr.S * pr.D;
  c.q = random_host(q_n, dtype);
  c.k = random_host(kv_n, dtype);
  c.v = random_host(kv_n, dtype);
  c.dout = random_host(q_n, dtype);
  if (pr.mask != Mask::None) {
    const int64_t plane = pr.T * pr.S;
    const int64_t n = pr.mask == Mask::PerHead ? pr.B * pr.H * plane : plane;
    const std::vector<float> r = ts::cuda_test::random_floats(static_cast<size_t>(n), next_seed());
    c.mask.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < c.mask.size(); ++i) c.mask[i] = r[i] > -0.5f;  // ~70% visible
    if (pr.T > 1)  // query row 1 of the first plane sees nothing: out 0, lse -inf, no gradient
      for (int64_t s = 0; s < pr.S; ++s) c.mask[static_cast<size_t>(pr.S + s)] = 0;
    if (pr.mask == Mask::PerHead) {
      c.mask_h_stride = plane;
      c.mask_b_stride = pr.H * plane;
    }
  }
  // Documents of growing lengths, one after the other (row b shifted by b tokens).
  for (int64_t b = 0; b < pr.B && pr.documents > 0; ++b)
    for (int64_t t = 0; t < pr.T; ++t)
      c.segments.push_back(
          static_cast<int32_t>(std::min(pr.documents - 1, (t + b) * (t + b) * pr.documents / (pr.T * pr.T))));
  const ts::cpu::AttentionShape s = c.cpu_shape();
  c.out.resize(c.q.bytes.size());
  c.lse.resize(static_cast<size_t>(pr.B * pr.H * pr.T));
  ts::cpu::attention_forward(dtype, s, c.q.bytes.data(), c.k.bytes.data(), c.v.bytes.data(), c.out.data(),
                             c.lse.data());
  c.dq.resize(c.q.bytes.size());
  c.dk.resize(c.k.bytes.size());
  c.dv.resize(c.v.bytes.size());
  ts::cpu::attention_backward(dtype, s, c.q.bytes.data(), c.k.bytes.data(), c.v.bytes.data(), c.out.data(),
                              c.lse.data(), c.dout.bytes.data(), c.dq.data(), c.dk.data(), c.dv.data());
  return c;
}

// The GPU's results of one check_case: forward (out, lse) and backward (dq, dk, dv).
struct GpuGrads {
  std::vector<unsigned char> out;
  std::vector<float> lse;
  std::vector<unsigned char> dq, dk, dv;
};

// How check_case runs the GPU side: forward and backward on dense [B, H, T, D] /
// [B, Hkv, S, D] device buffers, and a label naming the implementation.
struct AttentionLaunch {
  std::string label;
  std::function<void(const FlashAttentionShape&, const void* q, const void* k, const void* v, void* out, float* lse)>
      forward;
  std::function<void(const FlashAttentionShape&, const void* q, const void* k, const void* v, const void* out,
                     const float* lse, const void* dout, void* dq, void* dk, void* dv)>
      backward;
};

// tessera's kernels on `path` (the backward's scratch poisoned first).
inline AttentionLaunch tessera_kernels(DType dtype, FlashAttentionPath path) {
  AttentionLaunch l;
  l.label = kernel_label(path);
  l.forward = [dtype, path](const FlashAttentionShape& s, const void* q, const void* k, const void* v, void* out,
                            float* lse) {
    ts::cuda::flash_attention_forward(dtype, s, q, k, v, out, lse, nullptr, path);
  };
  l.backward = [dtype, path](const FlashAttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                             const float* lse, const void* dout, void* dq, void* dk, void* dv) {
    DeviceBuffer<float> scratch(ts::cuda::flash_attention_backward_scratch_bytes(s) / sizeof(float) + 1);
    scratch.poison();
    ts::cuda::flash_attention_backward(dtype, s, q, k, v, out, lse, dout, dq, dk, dv, scratch.get(), nullptr, path);
  };
  return l;
}

// Runs forward and backward on the GPU with `launch` and compares with the CPU.
inline GpuGrads check_case(const Case& c, const AttentionLaunch& launch) {
  const std::string what = c.pr.str(c.dtype) + launch.label;
  const double tol = tolerance(c.dtype, std::max(c.pr.T, c.pr.S));
  DeviceBuffer<unsigned char> q(c.q.bytes), k(c.k.bytes), v(c.v.bytes), dout(c.dout.bytes);
  DeviceBuffer<uint8_t> mask(c.mask);
  DeviceBuffer<int32_t> segments(c.segments);
  const ts::cuda::FlashAttentionShape s =
      c.gpu_shape(c.mask.empty() ? nullptr : mask.get(), c.segments.empty() ? nullptr : segments.get());

  DeviceBuffer<unsigned char> out(c.out.size());
  DeviceBuffer<float> lse(c.lse.size());
  out.poison();
  lse.poison();
  launch.forward(s, q.get(), k.get(), v.get(), out.get(), lse.get());
  GpuGrads g;
  g.out = out.download();
  g.lse = lse.download();
  EXPECT_LT(rel_error_inf(to_floats(g.out, c.dtype), to_floats(c.out, c.dtype)), tol) << what << ": out";
  // lse is float32 from identical inputs on both sides.
  EXPECT_LT(rel_error_inf(g.lse, c.lse), ts::cuda_test::kF32Tolerance) << what << ": lse";

  // Backward from the CPU's out and lse.
  DeviceBuffer<unsigned char> out_in(c.out);
  DeviceBuffer<float> lse_in(c.lse);
  DeviceBuffer<unsigned char> dq(c.dq.size()), dk(c.dk.size()), dv(c.dv.size());
  dq.poison();
  dk.poison();
  dv.poison();
  launch.backward(s, q.get(), k.get(), v.get(), out_in.get(), lse_in.get(), dout.get(), dq.get(), dk.get(), dv.get());
  g.dq = dq.download();
  g.dk = dk.download();
  g.dv = dv.download();
  // A query that sees a single key has P = 1 and dq = dk = 0 in exact arithmetic (dP and
  // delta cancel); both sides then hold rounding noise, checked to be tiny instead.
  const bool single_key = c.pr.mask == Mask::None && (c.pr.S == 1 || (c.pr.causal && c.pr.T == 1));
  if (single_key) {
    EXPECT_LT(max_abs(to_floats(g.dq, c.dtype)), 1e-4) << what << ": dq (= 0)";
    EXPECT_LT(max_abs(to_floats(g.dk, c.dtype)), 1e-4) << what << ": dk (= 0)";
  } else {
    EXPECT_LT(ts::cuda_test::rel_error(to_floats(g.dq, c.dtype), to_floats(c.dq, c.dtype)), tol) << what << ": dq";
    EXPECT_LT(ts::cuda_test::rel_error(to_floats(g.dk, c.dtype), to_floats(c.dk, c.dtype)), tol) << what << ": dk";
  }
  EXPECT_LT(ts::cuda_test::rel_error(to_floats(g.dv, c.dtype), to_floats(c.dv, c.dtype)), tol) << what << ": dv";
  return g;
}

inline GpuGrads check_case(const Case& c, FlashAttentionPath path) {
  return check_case(c, tessera_kernels(c.dtype, path));
}

// ---- op level ----

inline Array random_array(const Shape& shape, DType dtype) {
  std::vector<float> v = ts::cuda_test::random_floats(static_cast<size_t>(ts::numel(shape)), next_seed());
  Array x = Array::from_vector(v, shape);
  if (dtype != DType::Float32) x = ts::astype(x, dtype);
  x.eval();  // the GPU and the CPU read the same rounded values
  return x;
}

inline std::vector<float> values(const Array& a) { return a.to_vector<float>(); }

}  // namespace tessera::cuda_test::attention
