// A custom kernel used in a model: sliding-window (local) causal attention registered as
// a custom op (tessera/core/custom_op.h), checked against the same attention composed of
// built-in ops — forward values and every parameter's gradient, through jit.
//
//   local_attention(q, k, v; window, scale) -> out, lse       q, k, v: f32[B, H, T, D]
//     out[i] = sum_{j in (i - window, i]} p_ij v_j,  p_ij = exp(scale q_i.k_j - lse_i)
//     lse[i] = log sum_{j in (i - window, i]} exp(scale q_i.k_j)
//
// The CPU kernel visits only the window (O(T * window * D) per head, not O(T^2 D)); the
// vjp is written with ops from the saved lse (the backward of flash attention:
// dS = P * (dP - rowsum(dO * O))), so grad works everywhere the op does. Batch and head
// dims shard freely under SPMD. With a GPU the same op runs the CUDA source below,
// compiled at run time with NVRTC (one thread per query row).
//
// Usage: example_custom_kernel [--steps N]. Exits 1 when the custom op and the reference
// differ by more than float32 rounding.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/core/custom_op.h"
#include "tessera/tessera.h"

namespace ts = tessera;

namespace {

constexpr const char* kCudaSource = R"(
extern "C" __global__ void local_attention_fwd(const float* q, const float* k, const float* v, float* out,
                                               float* lse, long long rows, long long T, long long D,
                                               long long window, long long scale_bits) {
  long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // (b, h, i) flattened
  if (row >= rows) return;
  const float scale = __longlong_as_double(scale_bits);
  long long i = row % T, base = row - i;  // the first row of this (b, h)
  long long lo = i - window + 1 < 0 ? 0 : i - window + 1;
  float m = -__int_as_float(0x7f800000), l = 0.f;  // -inf (NVRTC has no math.h)
  for (long long d = 0; d < D; ++d) out[row * D + d] = 0.f;
  for (long long j = lo; j <= i; ++j) {  // online softmax over the window
    float s = 0.f;
    for (long long d = 0; d < D; ++d) s += q[row * D + d] * k[(base + j) * D + d];
    s *= scale;
    float m2 = fmaxf(m, s), c = expf(m - m2), p = expf(s - m2);
    for (long long d = 0; d < D; ++d) out[row * D + d] = out[row * D + d] * c + p * v[(base + j) * D + d];
    l = l * c + p;
    m = m2;
  }
  for (long long d = 0; d < D; ++d) out[row * D + d] /= l;
  lse[row] = m + logf(l);
}
)";

// One (b, h) slice at a time: each query row's window, two passes (max, then sums) in
// double so the result is the float32 rounding of the exact value.
void local_attention_cpu(const std::vector<ts::InputBuffer>& in, const std::vector<ts::OutputBuffer>& out,
                         const ts::CustomAttributes& at) {
  const int64_t window = ts::attribute_int(at, "window", "local_attention");
  const double scale = ts::attribute_double(at, "scale", "local_attention");
  const ts::Shape& s = in[0].shape;
  const int64_t T = s[2], D = s[3], slices = s[0] * s[1];
  const float *q = in[0].as<const float>(), *k = in[1].as<const float>(), *v = in[2].as<const float>();
  float *o = out[0].as<float>(), *lse = out[1].as<float>();
  ts::parallel_for(slices, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> score(static_cast<size_t>(window)), acc(static_cast<size_t>(D));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t base = bh * T;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t lo = std::max<int64_t>(0, i - window + 1);
        double m = -INFINITY;
        for (int64_t j = lo; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[(base + i) * D + d]) * k[(base + j) * D + d];
          score[static_cast<size_t>(j - lo)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = lo; j <= i; ++j) {
          const double p = std::exp(score[static_cast<size_t>(j - lo)] - m);
          l += p;
          for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += p * v[(base + j) * D + d];
        }
        for (int64_t d = 0; d < D; ++d) o[(base + i) * D + d] = static_cast<float>(acc[static_cast<size_t>(d)] / l);
        lse[base + i] = static_cast<float>(m + std::log(l));
      }
    }
  });
}

// [T, T] bool: key j is visible from query i.
ts::Array window_mask(int64_t T, int64_t window) {
  ts::Array i = ts::expand_dims(ts::arange(T), 1), j = ts::expand_dims(ts::arange(T), 0);
  return ts::logical_and(ts::less_equal(j, i), ts::greater(j, i - ts::Array::scalar(double(window), ts::DType::Int64)));
}

ts::Array scores(const ts::Array& q, const ts::Array& k, double scale) {
  return ts::matmul(q, ts::transpose(k, {0, 1, 3, 2})) * scale;
}

// The backward of attention from the saved statistics, in ops.
std::vector<ts::Array> local_attention_vjp(const std::vector<ts::Array>& x, const std::vector<ts::Array>& ct,
                                           const std::vector<ts::Array>& outs, const ts::CustomAttributes& at) {
  const int64_t window = ts::attribute_int(at, "window", "local_attention");
  const double scale = ts::attribute_double(at, "scale", "local_attention");
  const ts::Array &q = x[0], &k = x[1], &v = x[2], &o = outs[0], &lse = outs[1];
  const ts::Array &dout = ct[0], &dlse = ct[1];
  ts::Array mask = window_mask(q.shape(2), window);
  ts::Array p = ts::where(mask, ts::exp(scores(q, k, scale) - ts::expand_dims(lse, 3)), ts::zeros({}));
  ts::Array dv = ts::matmul(ts::transpose(p, {0, 1, 3, 2}), dout);
  ts::Array dp = ts::matmul(dout, ts::transpose(v, {0, 1, 3, 2}));
  // d lse / d s_ij = p_ij, so an lse cotangent adds to every row's dS as dlse * p.
  ts::Array ds = p * (dp - ts::sum(dout * o, {3}, true) + ts::expand_dims(dlse, 3));
  return {ts::matmul(ds, k) * scale, ts::matmul(ts::transpose(ds, {0, 1, 3, 2}), q) * scale, dv};
}

void register_local_attention() {
  ts::CustomOpDefinition d;
  d.name = "local_attention";
  d.num_inputs = 3;
  d.input_dtypes = {ts::DType::Float32, ts::DType::Float32, ts::DType::Float32};
  d.infer = [](const std::vector<ts::TensorSpec>& in, const ts::CustomAttributes& at) {
    if (ts::attribute_int(at, "window", "local_attention") < 1)
      ts::fail<ts::ValueError>("local_attention: window {} (expected >= 1)", ts::attribute_int(at, "window", ""));
    ts::attribute_double(at, "scale", "local_attention");
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].shape.size() != 4 || in[i].shape != in[0].shape)
        ts::fail<ts::ShapeError>("local_attention: input {} is {} (expected [B, H, T, D] like q, {})", i,
                                 ts::to_string(in[i].shape), ts::to_string(in[0].shape));
    const ts::Shape& s = in[0].shape;
    return std::vector<ts::TensorSpec>{{s, ts::DType::Float32}, {{s[0], s[1], s[2]}, ts::DType::Float32}};
  };
  d.cpu_kernel = local_attention_cpu;
  d.cuda = ts::CustomCudaKernel{
      kCudaSource, "local_attention_fwd",
      [](const std::vector<ts::TensorSpec>& in, const std::vector<ts::TensorSpec>&, const ts::CustomAttributes& at) {
        const ts::Shape& s = in[0].shape;
        const int64_t rows = s[0] * s[1] * s[2];
        double scale = ts::attribute_double(at, "scale", "local_attention");
        int64_t scale_bits = 0;
        std::memcpy(&scale_bits, &scale, sizeof scale);
        ts::CudaLaunch l;
        l.block = {128, 1, 1};
        l.grid = {static_cast<unsigned>((rows + 127) / 128), 1, 1};
        l.scalars = {rows, s[2], s[3], ts::attribute_int(at, "window", "local_attention"), scale_bits};
        return l;
      }};
  d.vjp = local_attention_vjp;
  d.sharding = ts::CustomSharding::factors("b h t d, b h t d, b h t d -> b h t d, b h t", {"b", "h"});
  d.cost = [](const std::vector<ts::TensorSpec>& in, const std::vector<ts::TensorSpec>&,
              const ts::CustomAttributes& at) {
    const ts::Shape& s = in[0].shape;
    const double w = double(std::min<int64_t>(ts::attribute_int(at, "window", ""), s[2]));
    return ts::Cost{4.0 * double(s[0] * s[1] * s[2]) * w * double(s[3]), 4.0 * 4.0 * double(ts::numel(s))};
  };
  ts::register_custom_op(std::move(d));
}

// The model: one attention block, x [B, T, C] -> x + attn(x) Wo, heads of width D.
struct Config {
  int64_t B = 2, T = 48, C = 32, H = 4, window = 8;
};

ts::Array block(const ts::Tree& p, const ts::Array& x, const Config& c, bool custom) {
  const int64_t D = c.C / c.H;
  const double scale = 1.0 / std::sqrt(double(D));
  auto heads = [&](const ts::Array& w) {
    return ts::transpose(ts::reshape(ts::matmul(x, w), {c.B, c.T, c.H, D}), {0, 2, 1, 3});
  };
  ts::Array q = heads(p.at("wq").leaf()), k = heads(p.at("wk").leaf()), v = heads(p.at("wv").leaf());
  ts::Array a;
  if (custom) {
    a = ts::custom_op("local_attention", {q, k, v}, {{"window", c.window}, {"scale", scale}})[0];
  } else {  // the composed reference: full scores, masked to the window
    ts::Array s = ts::where(window_mask(c.T, c.window), scores(q, k, scale), ts::full({}, -1e30));
    a = ts::matmul(ts::softmax(s, -1), v);
  }
  ts::Array merged = ts::reshape(ts::transpose(a, {0, 2, 1, 3}), {c.B, c.T, c.C});
  return x + ts::matmul(merged, p.at("wo").leaf());
}

double max_abs_diff(const ts::Array& a, const ts::Array& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
  register_local_attention();
  Config c;
  auto keys = ts::random::split_keys(ts::key(7), 6);
  const double init = 1.0 / std::sqrt(double(c.C));
  ts::Tree params{{"wq", ts::random::normal(keys[0], {c.C, c.C}) * init},
                  {"wk", ts::random::normal(keys[1], {c.C, c.C}) * init},
                  {"wv", ts::random::normal(keys[2], {c.C, c.C}) * init},
                  {"wo", ts::random::normal(keys[3], {c.C, c.C}) * init}};
  ts::Array x = ts::random::normal(keys[4], {c.B, c.T, c.C});
  ts::Array target = ts::random::normal(keys[5], {c.B, c.T, c.C});

  // One jitted training step per variant: loss and gradients, then SGD.
  auto make_step = [&](bool custom) {
    return ts::jit([&c, custom](const ts::Tree& args, const ts::StaticArgs&) -> ts::Tree {
      auto loss_of = [&](const ts::Tree& p) {
        ts::Array y = block(p, args.at("x").leaf(), c, custom);
        return ts::mean(ts::square(y - args.at("target").leaf()));
      };
      auto [loss, g] = ts::value_and_grad(loss_of)(args.at("params"));
      return ts::Tree{{"loss", loss}, {"grads", g}};
    });
  };
  auto custom_step = make_step(true), reference_step = make_step(false);
  double worst_grad = 0, worst_loss = 0;
  ts::Tree p = params;
  for (int s = 0; s < steps; ++s) {
    ts::Tree args{{"params", p}, {"x", ts::Tree(x)}, {"target", ts::Tree(target)}};
    ts::Tree got = custom_step(args), want = reference_step(args);
    const double lc = got.at("loss").leaf().item<double>(), lr = want.at("loss").leaf().item<double>();
    worst_loss = std::max(worst_loss, std::abs(lc - lr) / std::abs(lr));
    for (const char* name : {"wq", "wk", "wv", "wo"}) {
      const ts::Array& gc = got.at("grads").at(name).leaf();
      const ts::Array& gr = want.at("grads").at(name).leaf();
      const double scale = std::max(1e-6, ts::max(ts::abs(gr)).item<double>());
      worst_grad = std::max(worst_grad, max_abs_diff(gc, gr) / scale);
    }
    if (s % 5 == 0 || s == steps - 1) std::printf("step %3d  loss %.6f (reference %.6f)\n", s, lc, lr);
    p = ts::tree_map([](const ts::Array& w, const ts::Array& g) { return w - g * 0.5; }, p, got.at("grads"));
  }
  const ts::Cost cost =
      ts::graph_cost({ts::custom_op("local_attention",
                                    {ts::zeros({c.B, c.H, c.T, c.C / c.H}), ts::zeros({c.B, c.H, c.T, c.C / c.H}),
                                     ts::zeros({c.B, c.H, c.T, c.C / c.H})},
                                    {{"window", c.window}, {"scale", 1.0}})[0]});
  std::printf("local_attention: %.0f FLOPs per call (window %lld of %lld tokens)\n", cost.flops,
              static_cast<long long>(c.window), static_cast<long long>(c.T));
  std::printf("largest relative difference to the composed reference: loss %.2e, gradients %.2e\n", worst_loss,
              worst_grad);
  const bool ok = worst_loss < 1e-5 && worst_grad < 1e-4;
  std::printf("%s\n", ok ? "OK: the custom op matches the reference" : "FAIL: the custom op differs");
  return ok ? 0 : 1;
}
