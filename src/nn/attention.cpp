#include "tessera/nn/attention.h"

#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/nn/rotary.h"

namespace tessera::nn {

void Attention::validate() const {
  if (dim <= 0 || heads <= 0 || kv_heads < 0)
    fail<ValueError>("Attention: dim {}, heads {} must be positive and kv_heads {} >= 0", dim, heads, kv_heads);
  if (dim % heads != 0) fail<ValueError>("Attention: dim {} is not a multiple of heads {}", dim, heads);
  if (heads % resolved_kv_heads() != 0)
    fail<ValueError>("Attention: heads {} is not a multiple of kv_heads {}", heads, resolved_kv_heads());
  if (rope && head_dim() % 2 != 0) fail<ValueError>("Attention: RoPE needs an even head_dim (got {})", head_dim());
  if (rope && rope_llama3) rope_llama3->validate();
}

Tree Attention::init(ParamScope scope) const {
  validate();
  const int64_t qkv = (heads + 2 * resolved_kv_heads()) * head_dim();
  Tree p;
  p["wqkv"] = scope.param("wqkv", {.shape = {dim, qkv},
                                   .axes = {"embed", "heads"},
                                   .init = Initializer::normal(init_std),
                                   .kind = ParamKind::Weight});
  p["wo"] = scope.param("wo", {.shape = {dim, dim},
                               .axes = {"heads", "embed"},
                               .init = Initializer::normal(out_std),
                               .kind = ParamKind::Weight});
  if (bias) {
    p["bqkv"] =
        scope.param("bqkv", {.shape = {qkv}, .axes = {"heads"}, .init = Initializer::zeros(), .kind = ParamKind::Bias});
    p["bo"] =
        scope.param("bo", {.shape = {dim}, .axes = {"embed"}, .init = Initializer::zeros(), .kind = ParamKind::Bias});
  }
  return p;
}

Array Attention::operator()(const Tree& p, const Array& x, KVState* cache) const {
  return forward(p, x, cache, nullptr);
}

Array Attention::operator()(const Tree& p, const Array& x, const Packing& packing) const {
  return forward(p, x, nullptr, &packing);
}

Array Attention::forward(const Tree& p, const Array& x, KVState* cache, const Packing* packing) const {
  if (x.ndim() != 3 || x.shape(2) != dim)
    fail<ShapeError>("Attention: x has shape {} (expected [batch, seq, {}])", tessera::to_string(x.shape()), dim);
  const int64_t b = x.shape(0), t = x.shape(1), h = heads, hkv = resolved_kv_heads(), dh = head_dim();
  if (packing != nullptr)
    for (const Array* a : {&packing->segments, &packing->positions})
      if (!a->valid() || !is_integral(a->dtype()) || a->shape() != Shape{b, t})
        fail<ShapeError>(
            "Attention: packing {} are {} (expected integer [batch {}, seq {}])",
            a == &packing->segments ? "segments" : "positions",
            a->valid() ? std::string(name(a->dtype())) + tessera::to_string(a->shape()) : std::string("missing"), b, t);
  Array qkv = project(projection, x, p.at("wqkv").leaf(), 0);
  if (bias) qkv = qkv + p.at("bqkv").leaf();
  // Columns are grouped by kv head: [Hkv, G + 2, Dh] with G = H / Hkv query heads,
  // then that group's k and v. Splitting the columns over devices (tensor
  // parallelism on "heads") then gives each device whole groups: its own q, k and v.
  const int64_t g = h / hkv;
  Array groups = reshape(qkv, {b, t, hkv, g + 2, dh});
  auto heads_first = [&](const Array& a, int64_t n) { return transpose(reshape(a, {b, t, n, dh}), {0, 2, 1, 3}); };
  Array q = heads_first(slice_axis(groups, 3, 0, g), h);
  Array k = heads_first(slice_axis(groups, 3, g, g + 1), hkv);
  Array v = heads_first(slice_axis(groups, 3, g + 1, g + 2), hkv);

  int64_t offset = 0;
  if (cache != nullptr && cache->k.valid()) {
    const Shape want{b, hkv, cache->k.shape().size() == 4 ? cache->k.shape(2) : -1, dh};
    if (cache->k.shape() != want || cache->v.shape() != want)
      fail<ShapeError>("Attention: cache k {} / v {} do not match [batch {}, kv_heads {}, S, head_dim {}]",
                       tessera::to_string(cache->k.shape()), tessera::to_string(cache->v.shape()), b, hkv, dh);
    offset = cache->k.shape(2);
  }
  if (rope) {
    const Rotary rotary{.head_dim = dh, .theta = rope_theta, .llama3 = rope_llama3};
    q = packing != nullptr ? rotary(q, packing->positions) : rotary(q, offset);
    k = packing != nullptr ? rotary(k, packing->positions) : rotary(k, offset);
  }
  Array out;
  if (packing != nullptr) {
    out = scaled_dot_product_attention(q, k, v, /*causal=*/true, std::nullopt, std::nullopt, packing->segments);
  } else if (offset == 0) {
    out = scaled_dot_product_attention(q, k, v, /*causal=*/true);
  } else {
    k = concatenate({cache->k, k}, 2);
    v = concatenate({cache->v, v}, 2);
    if (t == 1) {
      out = scaled_dot_product_attention(q, k, v, /*causal=*/false);
    } else {
      // The kernel's causal mask is top-left aligned; new query i sits at position
      // offset + i and sees keys s <= offset + i.
      const int64_t s_len = offset + t;
      std::vector<bool> visible(static_cast<size_t>(t * s_len));
      for (int64_t i = 0; i < t; ++i)
        for (int64_t s = 0; s < s_len; ++s) visible[static_cast<size_t>(i * s_len + s)] = s <= offset + i;
      out = scaled_dot_product_attention(q, k, v, /*causal=*/false, Array::from_vector(visible, {t, s_len}));
    }
  }
  if (cache != nullptr) {
    cache->k = k;
    cache->v = v;
  }
  Array merged = reshape(transpose(out, {0, 2, 1, 3}), {b, t, dim});
  Array y = project(projection, merged, p.at("wo").leaf(), 1);
  return bias ? y + p.at("bo").leaf() : y;
}

}  // namespace tessera::nn
