// tessera.nn (activations, norms, attention, losses: the fused kernels of core/ops.h),
// tessera.random (Philox keys, JAX's model) and the fused AdamW update.
#include <fmt/format.h>

#include "bindings.h"
#include "tessera/core/checkpoint.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"

namespace tessera::python {
namespace {

Reduction reduction_of(const std::string& text) {
  if (text == "mean") return Reduction::Mean;
  if (text == "sum") return Reduction::Sum;
  if (text == "none") return Reduction::None;
  throw nb::value_error(
      fmt::format("cross_entropy: reduction must be 'mean', 'sum' or 'none', got '{}'", text).c_str());
}

}  // namespace

void register_nn_ops(nb::module_& m) {
  nb::module_ nn = m.def_submodule("nn", "Activations, normalization, attention and losses (fused kernels).");
#define TESSERA_ACTIVATION(py, cpp) \
  nn.def(                           \
      py, [](nb::handle x) { return cpp(as_array(x, py)); }, nb::arg("x"))
  TESSERA_ACTIVATION("relu", relu);
  TESSERA_ACTIVATION("sigmoid", sigmoid);
  TESSERA_ACTIVATION("silu", silu);
  TESSERA_ACTIVATION("swish", silu);
  TESSERA_ACTIVATION("tanh", tanh);
#undef TESSERA_ACTIVATION
  nn.def(
      "gelu", [](nb::handle x, bool approximate) { return gelu(as_array(x, "gelu"), approximate); }, nb::arg("x"),
      nb::arg("approximate") = true);
  nn.def(
      "softmax", [](nb::handle x, int axis) { return softmax(as_array(x, "softmax"), axis); }, nb::arg("x"),
      nb::arg("axis") = -1);
  nn.def(
      "log_softmax", [](nb::handle x, int axis) { return log_softmax(as_array(x, "log_softmax"), axis); }, nb::arg("x"),
      nb::arg("axis") = -1);
  nn.def(
      "logsumexp",
      [](nb::handle a, nb::handle axis, bool keepdims) {
        return logsumexp(as_array(a, "logsumexp"), as_axes(axis, "logsumexp"), keepdims);
      },
      nb::arg("a"), nb::arg("axis").none() = nb::none(), nb::arg("keepdims") = false);
  nn.def(
      "layer_norm",
      [](nb::handle x, nb::handle weight, nb::handle bias, double eps) {
        return layer_norm(as_array(x, "layer_norm"), as_optional_array(weight, "layer_norm: weight"),
                          as_optional_array(bias, "layer_norm: bias"), eps);
      },
      nb::arg("x"), nb::arg("weight").none() = nb::none(), nb::arg("bias").none() = nb::none(), nb::arg("eps") = 1e-5);
  nn.def(
      "rms_norm",
      [](nb::handle x, nb::handle weight, double eps) {
        return rms_norm(as_array(x, "rms_norm"), as_optional_array(weight, "rms_norm: weight"), eps);
      },
      nb::arg("x"), nb::arg("weight").none() = nb::none(), nb::arg("eps") = 1e-6);
  nn.def(
      "scaled_dot_product_attention",
      [](nb::handle q, nb::handle k, nb::handle v, bool causal, nb::handle mask, std::optional<double> scale,
         nb::handle segment_ids) {
        return scaled_dot_product_attention(as_array(q, "attention: q"), as_array(k, "attention: k"),
                                            as_array(v, "attention: v"), causal,
                                            as_optional_array(mask, "attention: mask"), scale,
                                            as_optional_array(segment_ids, "attention: segment_ids"));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = true, nb::arg("mask").none() = nb::none(),
      nb::arg("scale").none() = nb::none(), nb::arg("segment_ids").none() = nb::none(),
      "q [B, H, T, D], k and v [B, Hkv, S, D] (H a multiple of Hkv); mask bool, true = attend; segment_ids "
      "integer [B, T] (T == S): packed documents, a query sees only keys of its own segment.");
  nn.def(
      "cross_entropy",
      [](nb::handle logits, nb::handle targets, int64_t ignore_index, const std::string& reduction, int64_t classes) {
        return cross_entropy(as_array(logits, "cross_entropy: logits"), as_array(targets, "cross_entropy: targets"),
                             ignore_index, reduction_of(reduction), classes);
      },
      nb::arg("logits"), nb::arg("targets"), nb::arg("ignore_index") = -100, nb::arg("reduction") = "mean",
      nb::arg("classes") = 0, "Softmax cross-entropy of logits [..., V] against integer targets [...].");
  nn.def(
      "one_hot",
      [](nb::handle x, int64_t num_classes, nb::handle dtype) {
        return one_hot(as_array(x, "one_hot"), num_classes, as_dtype(dtype, DType::Float32, "one_hot"));
      },
      nb::arg("x"), nb::arg("num_classes"), nb::arg("dtype").none() = nb::none());

  nb::module_ random = m.def_submodule("random", "Counter-based random numbers (Philox-4x32-10), JAX's key model.");
  random.def(
      "key", [](uint64_t seed) { return key(seed); }, nb::arg("seed"));
  random.def(
      "split", [](nb::handle k, int64_t num) { return random::split(as_array(k, "split"), num); }, nb::arg("key"),
      nb::arg("num") = 2);
  random.def(
      "uniform",
      [](nb::handle k, nb::handle shape, nb::handle dtype, double minval, double maxval) {
        return random::uniform(as_array(k, "uniform"), as_shape(shape, "uniform"),
                               as_dtype(dtype, DType::Float32, "uniform"), minval, maxval);
      },
      nb::arg("key"), nb::arg("shape") = nb::tuple(), nb::arg("dtype").none() = nb::none(), nb::arg("minval") = 0.0,
      nb::arg("maxval") = 1.0);
  random.def(
      "normal",
      [](nb::handle k, nb::handle shape, nb::handle dtype) {
        return random::normal(as_array(k, "normal"), as_shape(shape, "normal"),
                              as_dtype(dtype, DType::Float32, "normal"));
      },
      nb::arg("key"), nb::arg("shape") = nb::tuple(), nb::arg("dtype").none() = nb::none());
  random.def(
      "bernoulli",
      [](nb::handle k, nb::handle p, nb::handle shape) {
        Array key_array = as_array(k, "bernoulli");
        if (is_python_scalar(p))
          return random::bernoulli(key_array, nb::cast<double>(p),
                                   shape.is_none() ? Shape{} : as_shape(shape, "bernoulli"));
        Array probs = as_array(p, "bernoulli");
        return random::bernoulli(key_array, probs, shape.is_none() ? probs.shape() : as_shape(shape, "bernoulli"));
      },
      nb::arg("key"), nb::arg("p") = 0.5, nb::arg("shape").none() = nb::none());

  m.def(
      "_adamw_update",
      [](const Array& param, const Array& grad, const Array& m1, const Array& v1, nb::handle lr, nb::handle step,
         double beta1, double beta2, double eps, double weight_decay) {
        AdamWConfig config;
        config.beta1 = beta1;
        config.beta2 = beta2;
        config.eps = eps;
        config.weight_decay = weight_decay;
        Array lr_array = as_array(lr, "adamw_update: lr");
        if (lr_array.dtype() != DType::Float32 && lr_array.dtype() != DType::Float64)
          lr_array = astype(lr_array, DType::Float32);
        Array step_array = as_array(step, "adamw_update: step");
        if (!is_integral(step_array.dtype())) step_array = astype(step_array, DType::Int32);
        return adamw_update(param, grad, m1, v1, lr_array, step_array, config);
      },
      nb::arg("param"), nb::arg("grad"), nb::arg("m"), nb::arg("v"), nb::arg("lr"), nb::arg("step"), nb::arg("beta1"),
      nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"));
  m.def(
      "checkpoint_name",
      [](nb::handle x, const std::string& name) { return checkpoint_name(as_array(x, "checkpoint_name"), name); },
      nb::arg("x"), nb::arg("name"));
}

}  // namespace tessera::python
