// tessera.nn's modules: the layers the models are built from (Linear, Embedding,
// LayerNorm, RMSNorm, GeluMLP, SwiGLU, Attention, Dropout), each a description whose
// init(seed) gives its parameters as a pytree and whose call applies it:
//
//   lin = ts.nn.Linear(3, 2); p = lin.init(seed=0); y = lin(p, x)
//
// Parameters are drawn from (seed, path) exactly as in the models (nn/param.h), and
// param_specs() lists each one's shape, logical axes, kind and initializer.
#include <fmt/format.h>

#include "bindings.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/dropout.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/layer_norm.h"
#include "tessera/nn/linear.h"
#include "tessera/nn/mlp.h"
#include "tessera/nn/rms_norm.h"
#include "trees.h"

namespace tessera::python {
namespace {

// init(seed, dtype, name): the module's parameters under `name` (the path prefix their
// random keys derive from) as a pytree.
template <typename Module>
nb::object init_params(const Module& module, uint64_t seed, nb::handle dtype, const std::string& name) {
  nn::ParamScope root(seed, as_dtype(dtype, DType::Float32, "init"));
  return from_tree(module.init(name.empty() ? root : root.child(name)));
}

template <typename Module>
nb::dict param_specs(const Module& module, const std::string& name) {
  nn::ParamScope root = nn::ParamScope::specs_only();
  module.init(name.empty() ? root : root.child(name));
  nb::dict out;
  for (const auto& [path, info] : root.specs()) {
    nb::dict d;
    d["shape"] = shape_tuple(info.shape);
    d["axes"] = nb::tuple(nb::cast(info.axes));
    d["kind"] = nn::to_string(info.kind);
    d["init"] = info.init.to_string();
    out[nb::str(path.c_str())] = d;
  }
  return out;
}

template <typename Module, typename Class>
void common(Class& cls) {
  cls.def(
         "init",
         [](const Module& m, uint64_t seed, nb::handle dtype, const std::string& name) {
           return init_params(m, seed, dtype, name);
         },
         nb::arg("seed") = 0, nb::arg("dtype").none() = nb::none(), nb::arg("name") = "",
         "The parameters (a dict), drawn from (seed, name + path) as the models draw theirs.")
      .def("param_specs", &param_specs<Module>, nb::arg("name") = "",
           "Each parameter's shape, logical axes, kind and initializer, by path.");
}

}  // namespace

void register_nn_modules(nb::module_& m) {
  nb::module_ nn_module = m.attr("nn");

  auto linear = nb::class_<nn::Linear>(nn_module, "Linear", "y = x @ w (+ b): w [in, out] normal(std), b zeros.");
  linear
      .def(
          "__init__",
          [](nn::Linear* self, int64_t in_features, int64_t out_features, bool bias, double std) {
            new (self) nn::Linear{in_features, out_features, bias, {"embed", "mlp"}, nn::Initializer::normal(std)};
          },
          nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias") = true, nb::arg("std") = 0.02)
      .def(
          "__call__",
          [](const nn::Linear& l, nb::handle p, nb::handle x) {
            return l(to_tree(p, "params"), as_array(x, "Linear: x"));
          },
          nb::arg("params"), nb::arg("x"));
  common<nn::Linear>(linear);

  auto embedding = nb::class_<nn::Embedding>(nn_module, "Embedding", "Rows of a [vocab, dim] table by integer id.");
  embedding
      .def(
          "__init__",
          [](nn::Embedding* self, int64_t vocab, int64_t dim, double std) {
            new (self) nn::Embedding{vocab, dim, {"vocab", "embed"}, nn::Initializer::normal(std)};
          },
          nb::arg("vocab"), nb::arg("dim"), nb::arg("std") = 0.02)
      .def(
          "__call__",
          [](const nn::Embedding& e, nb::handle p, nb::handle ids) {
            return e(to_tree(p, "params"), as_array(ids, "Embedding: ids"));
          },
          nb::arg("params"), nb::arg("ids"))
      .def(
          "attend",
          [](const nn::Embedding& e, nb::handle p, nb::handle x) {
            return e.attend(to_tree(p, "params"), as_array(x, "attend: x"));
          },
          nb::arg("params"), nb::arg("x"), "x [..., dim] -> logits [..., vocab] (a tied head).");
  common<nn::Embedding>(embedding);

  auto layer_norm = nb::class_<nn::LayerNorm>(nn_module, "LayerNorm");
  layer_norm
      .def(
          "__init__",
          [](nn::LayerNorm* self, int64_t dim, double eps, bool bias) {
            new (self) nn::LayerNorm{dim, eps, bias};
          },
          nb::arg("dim"), nb::arg("eps") = 1e-5, nb::arg("bias") = true)
      .def(
          "__call__",
          [](const nn::LayerNorm& n, nb::handle p, nb::handle x) {
            return n(to_tree(p, "params"), as_array(x, "LayerNorm: x"));
          },
          nb::arg("params"), nb::arg("x"));
  common<nn::LayerNorm>(layer_norm);

  auto rms_norm = nb::class_<nn::RMSNorm>(nn_module, "RMSNorm");
  rms_norm
      .def(
          "__init__",
          [](nn::RMSNorm* self, int64_t dim, double eps) {
            new (self) nn::RMSNorm{dim, eps};
          },
          nb::arg("dim"), nb::arg("eps") = 1e-5)
      .def(
          "__call__",
          [](const nn::RMSNorm& n, nb::handle p, nb::handle x) {
            return n(to_tree(p, "params"), as_array(x, "RMSNorm: x"));
          },
          nb::arg("params"), nb::arg("x"));
  common<nn::RMSNorm>(rms_norm);

  auto gelu_mlp = nb::class_<nn::GeluMLP>(nn_module, "GeluMLP", "GPT-2's MLP: Linear, tanh GELU, Linear.");
  gelu_mlp
      .def(
          "__init__",
          [](nn::GeluMLP* self, int64_t dim, int64_t hidden, bool bias, double std, double out_std) {
            new (self) nn::GeluMLP{dim, hidden, bias, std, out_std};
          },
          nb::arg("dim"), nb::arg("hidden"), nb::arg("bias") = true, nb::arg("std") = 0.02, nb::arg("out_std") = 0.02)
      .def(
          "__call__",
          [](const nn::GeluMLP& l, nb::handle p, nb::handle x) {
            return l(to_tree(p, "params"), as_array(x, "GeluMLP: x"));
          },
          nb::arg("params"), nb::arg("x"));
  common<nn::GeluMLP>(gelu_mlp);

  auto swiglu = nb::class_<nn::SwiGLU>(nn_module, "SwiGLU", "Llama's MLP: silu(x W1) * (x W3), then W2.");
  swiglu
      .def(
          "__init__",
          [](nn::SwiGLU* self, int64_t dim, int64_t hidden, double std, double out_std) {
            new (self) nn::SwiGLU{dim, hidden, std, out_std};
          },
          nb::arg("dim"), nb::arg("hidden"), nb::arg("std") = 0.02, nb::arg("out_std") = 0.02)
      .def(
          "__call__",
          [](const nn::SwiGLU& l, nb::handle p, nb::handle x) {
            return l(to_tree(p, "params"), as_array(x, "SwiGLU: x"));
          },
          nb::arg("params"), nb::arg("x"));
  common<nn::SwiGLU>(swiglu);

  auto attention = nb::class_<nn::Attention>(nn_module, "Attention",
                                             "Causal multi-head attention with grouped-query heads and optional RoPE: "
                                             "x [B, T, dim] -> [B, T, dim].");
  attention
      .def(
          "__init__",
          [](nn::Attention* self, int64_t dim, int64_t heads, int64_t kv_heads, bool bias, bool rope, double rope_theta,
             double std, double out_std) {
            nn::Attention a;
            a.dim = dim;
            a.heads = heads;
            a.kv_heads = kv_heads;
            a.bias = bias;
            a.rope = rope;
            a.rope_theta = rope_theta;
            a.init_std = std;
            a.out_std = out_std;
            a.validate();
            new (self) nn::Attention(a);
          },
          nb::arg("dim"), nb::arg("heads"), nb::arg("kv_heads") = 0, nb::arg("bias") = true, nb::arg("rope") = false,
          nb::arg("rope_theta") = 10000.0, nb::arg("std") = 0.02, nb::arg("out_std") = 0.02)
      .def(
          "__call__",
          [](const nn::Attention& a, nb::handle p, nb::handle x) {
            return a(to_tree(p, "params"), as_array(x, "Attention: x"));
          },
          nb::arg("params"), nb::arg("x"));
  common<nn::Attention>(attention);

  nb::class_<nn::Dropout>(nn_module, "Dropout",
                          "Zeroes each element with probability rate and scales the rest by "
                          "1 / (1 - rate); without a key (inference) it is the identity.")
      .def(
          "__init__", [](nn::Dropout* self, double rate) { new (self) nn::Dropout{rate}; }, nb::arg("rate"))
      .def(
          "__call__",
          [](const nn::Dropout& d, nb::handle x, nb::handle key) {
            return d(as_array(x, "Dropout: x"), as_optional_array(key, "Dropout: key"));
          },
          nb::arg("x"), nb::arg("key").none() = nb::none());
}

}  // namespace tessera::python
