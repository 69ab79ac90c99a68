#include "tessera/interop/hf_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <set>

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::interop {
namespace {

// A row-major float32 matrix on the host: the layout changes are index shuffles.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> values;

  float at(int64_t r, int64_t c) const { return values[static_cast<size_t>(r * cols + c)]; }
  float& at(int64_t r, int64_t c) { return values[static_cast<size_t>(r * cols + c)]; }
};

Matrix matrix_of(const Array& a) {
  Matrix m{a.ndim() == 2 ? a.shape(0) : 1, a.shape(-1), a.to_vector<float>()};
  return m;
}

// In 64 x 64 tiles: a plain row loop writes the transpose one column at a time, a cache
// (and TLB) miss per element on the large matrices (Llama's 2048 x 8192 projections).
Matrix transposed(const Matrix& m) {
  constexpr int64_t kTile = 64;
  Matrix t{m.cols, m.rows, std::vector<float>(m.values.size())};
  for (int64_t r0 = 0; r0 < m.rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < m.cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(r0 + kTile, m.rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + kTile, m.cols); ++c) t.at(c, r) = m.at(r, c);
  return t;
}

// Attention heads of a model: H query heads in kv groups of G, head size Dh.
struct Heads {
  int64_t h, hkv, dh;
  int64_t g() const { return h / hkv; }
};

Heads heads_of(const models::ModelConfig& c) { return {c.heads, c.resolved_kv_heads(), c.head_dim()}; }

// Source column in q / k / v ([in, out] layout, heads in order) of tessera's fused
// column `col` = (kv * (G + 2) + slot) * Dh + j; which = 0 q, 1 k, 2 v.
std::pair<int, int64_t> qkv_source(const Heads& hd, int64_t col) {
  const int64_t j = col % hd.dh, slot = (col / hd.dh) % (hd.g() + 2), kv = col / hd.dh / (hd.g() + 2);
  if (slot < hd.g()) return {0, (kv * hd.g() + slot) * hd.dh + j};
  return {slot == hd.g() ? 1 : 2, kv * hd.dh + j};
}

// qkv_source of each fused head block (Dh consecutive columns, which map to Dh
// consecutive source columns): the shuffles below copy rows block by block, in memory
// order (a column-by-column loop strides a whole row per element).
std::vector<std::pair<int, int64_t>> qkv_blocks(const Heads& hd) {
  std::vector<std::pair<int, int64_t>> blocks;
  for (int64_t c = 0; c < (hd.h + 2 * hd.hkv) * hd.dh; c += hd.dh) blocks.push_back(qkv_source(hd, c));
  return blocks;
}

// Where the rows of q, k and v lie: row r of part `which` (0 q, 1 k, 2 v) starts at
// base[which] + r * stride[which]. Separate matrices (Llama's projections) or column
// ranges of one [q | k | v] matrix (GPT-2's c_attn), without copying them apart.
template <typename T>
struct QkvRows {
  std::array<T*, 3> base;
  std::array<int64_t, 3> stride;
  T* row(int which, int64_t r) const {
    return base[static_cast<size_t>(which)] + r * stride[static_cast<size_t>(which)];
  }
};

// The [q | k | v] column ranges of a concatenated [rows, cols] buffer (q: H * Dh
// columns, k and v: Hkv * Dh).
template <typename T>
QkvRows<T> concatenated_rows(T* base, int64_t cols, const Heads& hd) {
  return {{base, base + hd.h * hd.dh, base + (hd.h + hd.hkv) * hd.dh}, {cols, cols, cols}};
}

QkvRows<const float> separate_rows(const Matrix& q, const Matrix& k, const Matrix& v) {
  return {{q.values.data(), k.values.data(), v.values.data()}, {q.cols, k.cols, v.cols}};
}

// tessera's fused [rows, (H + 2 Hkv) Dh] from q, k, v, into `out`.
void fuse_qkv(const Heads& hd, int64_t rows, const QkvRows<const float>& parts, float* out) {
  const int64_t width = (hd.h + 2 * hd.hkv) * hd.dh;
  const std::vector<std::pair<int, int64_t>> blocks = qkv_blocks(hd);
  for (int64_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < blocks.size(); ++b) {
      const auto [which, source] = blocks[b];
      const float* from = parts.row(which, r) + source;
      std::copy(from, from + hd.dh, out + r * width + static_cast<int64_t>(b) * hd.dh);
    }
}

// The inverse of fuse_qkv: writes q, k, v ([in, out] layout) where `parts` says.
void split_qkv(const Heads& hd, const float* fused, int64_t rows, const QkvRows<float>& parts) {
  const int64_t width = (hd.h + 2 * hd.hkv) * hd.dh;
  const std::vector<std::pair<int, int64_t>> blocks = qkv_blocks(hd);
  for (int64_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < blocks.size(); ++b) {
      const auto [which, source] = blocks[b];
      const float* from = fused + r * width + static_cast<int64_t>(b) * hd.dh;
      std::copy(from, from + hd.dh, parts.row(which, r) + source);
    }
}

// {q, k, v} as separate matrices.
std::vector<Matrix> split_qkv(const Heads& hd, const Matrix& fused) {
  std::vector<Matrix> parts;
  for (int64_t width : {hd.h * hd.dh, hd.hkv * hd.dh, hd.hkv * hd.dh})
    parts.push_back({fused.rows, width, std::vector<float>(static_cast<size_t>(fused.rows * width))});
  split_qkv(hd, fused.values.data(), fused.rows,
            QkvRows<float>{{parts[0].values.data(), parts[1].values.data(), parts[2].values.data()},
                           {parts[0].cols, parts[1].cols, parts[2].cols}});
  return parts;
}

// GPT-2's c_attn ([in, 3d] weight or [3d] bias, float32) <-> tessera's fused wqkv / bqkv,
// straight between the arrays' buffers: at 124M parameters, temporary copies (each a
// fresh allocation faulted in page by page) cost more than the shuffle itself.
Array fused_from_concatenated(const Heads& hd, const Array& qkv) {
  const int64_t cols = qkv.shape(-1), rows = qkv.size() / cols;
  Array out = Array::empty(qkv.shape(), DType::Float32);
  fuse_qkv(hd, rows, concatenated_rows(qkv.data<float>(), cols, hd), out.mutable_data<float>());
  return out;
}

Array concatenated_from_fused(const Heads& hd, const Array& fused) {
  const Array f32 = fused.dtype() == DType::Float32 ? fused : astype(fused, DType::Float32).eval();
  const int64_t cols = fused.shape(-1), rows = fused.size() / cols;
  Array out = Array::empty(fused.shape(), DType::Float32);
  split_qkv(hd, f32.data<float>(), rows, concatenated_rows(out.mutable_data<float>(), cols, hd));
  return out;
}

Array array_of(const Matrix& m, const Shape& shape) { return Array::from_vector(m.values, shape).eval(); }

// Hands out the expected tensors one by one (checking shape and dtype) and reports
// what is missing or left over.
class TensorTaker {
 public:
  TensorTaker(const HfTensors& tensors, std::string origin) : tensors_(tensors), origin_(std::move(origin)) {}

  const Array& take(const std::string& name, const Shape& shape) {
    auto it = tensors_.find(name);
    if (it == tensors_.end())
      fail<ValueError>("{}: tensor '{}' is missing (expected shape {})", origin_, name, to_string(shape));
    const HfTensor& t = it->second;
    if (t.array.shape() != shape)
      fail<ValueError>("{}: tensor '{}' has shape {} (expected {})", t.file, name, to_string(t.array.shape()),
                       to_string(shape));
    const DType dtype = t.array.dtype();
    if (dtype != DType::Float32 && dtype != DType::BFloat16 && dtype != DType::Float16)
      fail<ValueError>("{}: tensor '{}' has dtype {} (supported: F32, BF16, F16)", t.file, name, tessera::name(dtype));
    taken_.insert(name);
    return t.array;
  }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  Array take_f32(const std::string& name, const Shape& shape) {
    const Array& a = take(name, shape);
    return a.dtype() == DType::Float32 ? a : astype(a, DType::Float32).eval();
  }
  Matrix take_matrix(const std::string& name, const Shape& shape) { return matrix_of(take(name, shape)); }
  // Marks a tensor as known but unused (non-persistent buffers saved by old versions).
  void ignore(const std::string& name) { taken_.insert(name); }

  void check_all_taken() const {
    std::vector<std::string> unexpected;
    for (const auto& [name, t] : tensors_)
      if (!taken_.count(name)) unexpected.push_back(fmt::format("'{}' ({})", name, t.file));
    if (!unexpected.empty())
      fail<ValueError>("{}: unexpected tensor{} {} (not part of the model the config describes)", origin_,
                       unexpected.size() > 1 ? "s" : "", fmt::join(unexpected, ", "));
  }

 private:
  const HfTensors& tensors_;
  std::string origin_;
  std::set<std::string> taken_;
};

// The lm_head of a tied model: absent, or a copy of the embedding.
void check_tied_head(TensorTaker& taker, const HfTensors& tensors, const Array& wte, const models::ModelConfig& c) {
  if (!taker.contains("lm_head.weight")) return;
  const Array head = taker.take_f32("lm_head.weight", {c.vocab, c.dim});
  if (head.to_vector<float>() != wte.to_vector<float>())
    fail<ValueError>(
        "{}: tensor 'lm_head.weight' differs from the token embedding, but the config says tie_word_embeddings = "
        "true",
        tensors.at("lm_head.weight").file);
}

Tree gpt2_from_hf(const models::ModelConfig& c, const HfTensors& tensors, TensorTaker& taker) {
  // Hub GPT-2 files name tensors without the "transformer." of GPT2LMHeadModel's state dict.
  const std::string p = tensors.count("transformer.wte.weight") ? "transformer." : "";
  const int64_t d = c.dim, m = c.resolved_mlp_dim();
  const Heads hd = heads_of(c);
  Tree params;
  params["wte"] = taker.take_f32(p + "wte.weight", {c.vocab, d});
  params["wpe"] = taker.take_f32(p + "wpe.weight", {c.context, d});
  auto layer_norm = [&](const std::string& name) {
    return Tree{{"scale", taker.take_f32(name + ".weight", {d})}, {"bias", taker.take_f32(name + ".bias", {d})}};
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    return Tree{{"w", taker.take_f32(name + ".weight", {in, out})}, {"b", taker.take_f32(name + ".bias", {out})}};
  };
  std::vector<Tree> layers;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string h = fmt::format("{}h.{}.", p, l);
    Tree layer;
    layer["ln1"] = layer_norm(h + "ln_1");
    Tree attn;
    attn["wqkv"] = fused_from_concatenated(hd, taker.take_f32(h + "attn.c_attn.weight", {d, 3 * d}));
    attn["bqkv"] = fused_from_concatenated(hd, taker.take_f32(h + "attn.c_attn.bias", {3 * d}));
    attn["wo"] = taker.take_f32(h + "attn.c_proj.weight", {d, d});
    attn["bo"] = taker.take_f32(h + "attn.c_proj.bias", {d});
    layer["attn"] = attn;
    for (const char* buffer : {"attn.bias", "attn.masked_bias"})
      if (taker.contains(h + buffer)) taker.ignore(h + buffer);
    layer["ln2"] = layer_norm(h + "ln_2");
    layer["mlp"] = Tree{{"fc", linear(h + "mlp.c_fc", d, m)}, {"proj", linear(h + "mlp.c_proj", m, d)}};
    layers.push_back(std::move(layer));
  }
  params["layers"] = Tree::list(std::move(layers));
  params["lnf"] = layer_norm(p + "ln_f");
  if (c.resolved_tied()) {
    check_tied_head(taker, tensors, params.at("wte").leaf(), c);
  } else {
    params["head"] = array_of(transposed(taker.take_matrix("lm_head.weight", {c.vocab, d})), {d, c.vocab});
  }
  return params;
}

// A Mixtral layer's experts (nn/moe.h's tree) from either of transformers' layouts:
//   the hub's (save_pretrained's default): block_sparse_moe.gate.weight [E, d] and
//     block_sparse_moe.experts.N.{w1 (gate), w3 (up)} [f, d], w2 (down) [d, f];
//   transformers 5's fused one: mlp.gate.weight, mlp.experts.gate_up_proj [E, 2f, d]
//     (gate rows first), mlp.experts.down_proj [E, d, f].
Tree mixtral_experts_from_hf(const models::ModelConfig& c, const std::string& h, TensorTaker& taker) {
  const int64_t d = c.dim, m = c.resolved_mlp_dim(), e = c.moe_experts;
  const bool fused = taker.contains(h + "mlp.experts.gate_up_proj");
  const std::string prefix = h + (fused ? "mlp." : "block_sparse_moe.");
  Tree moe;
  moe["router"] = Tree{{"w", transpose(taker.take_f32(prefix + "gate.weight", {e, d})).eval()}};
  Array gate, up, down;  // [e, d, m], [e, d, m], [e, m, d]
  if (fused) {
    const Array gate_up = taker.take_f32(prefix + "experts.gate_up_proj", {e, 2 * m, d});
    gate = transpose(slice_axis(gate_up, 1, 0, m), {0, 2, 1});
    up = transpose(slice_axis(gate_up, 1, m, 2 * m), {0, 2, 1});
    down = transpose(taker.take_f32(prefix + "experts.down_proj", {e, d, m}), {0, 2, 1});
  } else {
    std::vector<Array> gates, ups, downs;
    for (int64_t x = 0; x < e; ++x) {
      const std::string n = fmt::format("{}experts.{}.", prefix, x);
      gates.push_back(transpose(taker.take_f32(n + "w1.weight", {m, d})));
      ups.push_back(transpose(taker.take_f32(n + "w3.weight", {m, d})));
      downs.push_back(transpose(taker.take_f32(n + "w2.weight", {d, m})));
    }
    gate = stack(gates, 0);
    up = stack(ups, 0);
    down = stack(downs, 0);
  }
  moe["gate"] = Tree{{"w", gate.eval()}};
  moe["up"] = Tree{{"w", up.eval()}};
  moe["down"] = Tree{{"w", down.eval()}};
  return moe;
}

Tree llama_from_hf(const models::ModelConfig& c, const HfTensors& tensors, TensorTaker& taker) {
  const int64_t d = c.dim, m = c.resolved_mlp_dim();
  const Heads hd = heads_of(c);
  // nn.Linear stores [out, in]; tessera's w is [in, out].
  auto linear_t = [&](const std::string& name, int64_t in, int64_t out) {
    return transposed(taker.take_matrix(name, {out, in}));
  };
  auto rms = [&](const std::string& name) { return Tree{{"scale", taker.take_f32(name, {d})}}; };
  Tree params;
  params["wte"] = taker.take_f32("model.embed_tokens.weight", {c.vocab, d});
  std::vector<Tree> layers;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string h = fmt::format("model.layers.{}.", l);
    Tree layer;
    layer["ln1"] = rms(h + "input_layernorm.weight");
    const Matrix q = linear_t(h + "self_attn.q_proj.weight", d, hd.h * hd.dh);
    const Matrix k = linear_t(h + "self_attn.k_proj.weight", d, hd.hkv * hd.dh);
    const Matrix v = linear_t(h + "self_attn.v_proj.weight", d, hd.hkv * hd.dh);
    const int64_t width = (hd.h + 2 * hd.hkv) * hd.dh;
    Tree attn;
    Array wqkv = Array::empty({d, width}, DType::Float32);
    fuse_qkv(hd, d, separate_rows(q, k, v), wqkv.mutable_data<float>());
    attn["wqkv"] = wqkv;
    attn["wo"] = array_of(linear_t(h + "self_attn.o_proj.weight", d, d), {d, d});
    layer["attn"] = attn;
    if (taker.contains(h + "self_attn.rotary_emb.inv_freq")) taker.ignore(h + "self_attn.rotary_emb.inv_freq");
    layer["ln2"] = rms(h + "post_attention_layernorm.weight");
    if (c.moe()) {
      layer["moe"] = mixtral_experts_from_hf(c, h, taker);
    } else {
      Tree mlp;
      mlp["gate"] = Tree{{"w", array_of(linear_t(h + "mlp.gate_proj.weight", d, m), {d, m})}};
      mlp["up"] = Tree{{"w", array_of(linear_t(h + "mlp.up_proj.weight", d, m), {d, m})}};
      mlp["down"] = Tree{{"w", array_of(linear_t(h + "mlp.down_proj.weight", m, d), {m, d})}};
      layer["mlp"] = mlp;
    }
    layers.push_back(std::move(layer));
  }
  params["layers"] = Tree::list(std::move(layers));
  params["lnf"] = rms("model.norm.weight");
  if (c.resolved_tied()) {
    check_tied_head(taker, tensors, params.at("wte").leaf(), c);
  } else {
    params["head"] = array_of(transposed(taker.take_matrix("lm_head.weight", {c.vocab, d})), {d, c.vocab});
  }
  return params;
}

// Collects (name, array) in order, cast to the export dtype.
struct TensorList {
  DType dtype;
  std::vector<std::pair<std::string, Array>> items;

  void add(const std::string& name, const Array& a) {
    Array f32 = a.dtype() == DType::Float32 ? a : astype(a, DType::Float32);
    items.emplace_back(name, (dtype == DType::Float32 ? f32 : astype(f32, dtype)).eval());
  }
  void add(const std::string& name, const Matrix& m, const Shape& shape) { add(name, array_of(m, shape)); }
};

const Array& leaf(const Tree& t, std::initializer_list<const char*> path) {
  const Tree* node = &t;
  for (const char* key : path) node = &node->at(key);
  return node->leaf();
}

void gpt2_to_hf(const models::ModelConfig& c, const Tree& params, TensorList& out) {
  const int64_t d = c.dim;
  const Heads hd = heads_of(c);
  out.add("transformer.wte.weight", params.at("wte").leaf());
  out.add("transformer.wpe.weight", params.at("wpe").leaf());
  for (int64_t l = 0; l < c.layers; ++l) {
    const Tree& layer = params.at("layers").at(static_cast<size_t>(l));
    const std::string h = fmt::format("transformer.h.{}.", l);
    out.add(h + "ln_1.weight", leaf(layer, {"ln1", "scale"}));
    out.add(h + "ln_1.bias", leaf(layer, {"ln1", "bias"}));
    out.add(h + "attn.c_attn.weight", concatenated_from_fused(hd, leaf(layer, {"attn", "wqkv"})));
    out.add(h + "attn.c_attn.bias", concatenated_from_fused(hd, leaf(layer, {"attn", "bqkv"})));
    out.add(h + "attn.c_proj.weight", leaf(layer, {"attn", "wo"}));
    out.add(h + "attn.c_proj.bias", leaf(layer, {"attn", "bo"}));
    out.add(h + "ln_2.weight", leaf(layer, {"ln2", "scale"}));
    out.add(h + "ln_2.bias", leaf(layer, {"ln2", "bias"}));
    out.add(h + "mlp.c_fc.weight", leaf(layer, {"mlp", "fc", "w"}));
    out.add(h + "mlp.c_fc.bias", leaf(layer, {"mlp", "fc", "b"}));
    out.add(h + "mlp.c_proj.weight", leaf(layer, {"mlp", "proj", "w"}));
    out.add(h + "mlp.c_proj.bias", leaf(layer, {"mlp", "proj", "b"}));
  }
  out.add("transformer.ln_f.weight", leaf(params, {"lnf", "scale"}));
  out.add("transformer.ln_f.bias", leaf(params, {"lnf", "bias"}));
  if (!c.resolved_tied()) out.add("lm_head.weight", transposed(matrix_of(params.at("head").leaf())), {c.vocab, d});
}

void llama_to_hf(const models::ModelConfig& c, const Tree& params, TensorList& out) {
  const int64_t d = c.dim;
  const Heads hd = heads_of(c);
  auto add_t = [&](const std::string& name, const Array& w) {
    const Matrix t = transposed(matrix_of(w));
    out.add(name, t, {t.rows, t.cols});
  };
  out.add("model.embed_tokens.weight", params.at("wte").leaf());
  for (int64_t l = 0; l < c.layers; ++l) {
    const Tree& layer = params.at("layers").at(static_cast<size_t>(l));
    const std::string h = fmt::format("model.layers.{}.", l);
    out.add(h + "input_layernorm.weight", leaf(layer, {"ln1", "scale"}));
    const std::vector<Matrix> qkv = split_qkv(hd, matrix_of(leaf(layer, {"attn", "wqkv"})));
    out.add(h + "self_attn.q_proj.weight", transposed(qkv[0]), {hd.h * hd.dh, d});
    out.add(h + "self_attn.k_proj.weight", transposed(qkv[1]), {hd.hkv * hd.dh, d});
    out.add(h + "self_attn.v_proj.weight", transposed(qkv[2]), {hd.hkv * hd.dh, d});
    add_t(h + "self_attn.o_proj.weight", leaf(layer, {"attn", "wo"}));
    out.add(h + "post_attention_layernorm.weight", leaf(layer, {"ln2", "scale"}));
    if (c.moe()) {
      // The hub's Mixtral layout (what transformers' save_pretrained writes by default).
      const std::string b = h + "block_sparse_moe.";
      out.add(b + "gate.weight", transpose(leaf(layer, {"moe", "router", "w"})));
      for (int64_t x = 0; x < c.moe_experts; ++x) {
        const std::string n = fmt::format("{}experts.{}.", b, x);
        auto expert = [&](const char* name) {
          return squeeze(slice_axis(leaf(layer, {"moe", name, "w"}), 0, x, x + 1), {0});
        };
        out.add(n + "w1.weight", transpose(expert("gate")));
        out.add(n + "w2.weight", transpose(expert("down")));
        out.add(n + "w3.weight", transpose(expert("up")));
      }
    } else {
      add_t(h + "mlp.gate_proj.weight", leaf(layer, {"mlp", "gate", "w"}));
      add_t(h + "mlp.up_proj.weight", leaf(layer, {"mlp", "up", "w"}));
      add_t(h + "mlp.down_proj.weight", leaf(layer, {"mlp", "down", "w"}));
    }
  }
  out.add("model.norm.weight", leaf(params, {"lnf", "scale"}));
  if (!c.resolved_tied()) out.add("lm_head.weight", transposed(matrix_of(params.at("head").leaf())), {c.vocab, d});
}

}  // namespace

Tree params_from_hf(const models::ModelConfig& config, const HfTensors& tensors, const std::string& origin) {
  config.validate();
  TensorTaker taker(tensors, origin);
  Tree params = config.family == "gpt2" ? gpt2_from_hf(config, tensors, taker) : llama_from_hf(config, tensors, taker);
  taker.check_all_taken();
  return models::pad_vocabulary(config, params);  // the files hold `vocab` rows
}

std::vector<std::pair<std::string, Array>> hf_tensors_from_params(const models::ModelConfig& config, const Tree& params,
                                                                  DType dtype) {
  config.validate();
  if (dtype != DType::Float32 && dtype != DType::BFloat16)
    fail<ValueError>("hf export: dtype {} is not supported (float32 or bfloat16)", name(dtype));
  // The same structure and shapes as the model's own parameters, else a clear error.
  const models::Model model(config);
  const nn::ParamSpecs& specs = model.specs();
  const std::vector<std::string> paths = params.paths();
  const std::vector<Array> leaves = params.leaves();
  if (paths.size() != specs.size())
    fail<ValueError>("hf export: the parameters have {} tensors (the {} model has {})", paths.size(), config.family,
                     specs.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    auto it = specs.find(paths[i]);
    if (it == specs.end())
      fail<ValueError>("hf export: parameter '{}' is not part of the {} model", paths[i], config.family);
    if (leaves[i].shape() != it->second.shape)
      fail<ValueError>("hf export: parameter '{}' has shape {} (the config says {})", paths[i],
                       to_string(leaves[i].shape()), to_string(it->second.shape));
  }
  TensorList out{dtype, {}};
  const Tree unpadded = models::strip_vocabulary(config, params);  // the files hold `vocab` rows
  if (config.family == "gpt2")
    gpt2_to_hf(config, unpadded, out);
  else
    llama_to_hf(config, unpadded, out);
  return out.items;
}

}  // namespace tessera::interop
