// Reverse-mode differentiation (vjp, grad, value_and_grad) over the lazy graph.
#include "tessera/core/transforms.h"

#include <unordered_map>

#include "core/graph_walk.h"
#include "core/trace_state.h"
#include "tessera/core/ops.h"
#include "tessera/ir/primitives/elementwise.h"

namespace tessera {
namespace {

void accumulate(std::unordered_map<uint64_t, Array>& cts, const Array& target, Array ct, const char* where) {
  if (ct.shape() != target.shape())
    fail<ShapeError>("{}: cotangent of shape {} for a value of shape {} (a vjp rule returned the wrong shape)", where,
                     to_string(ct.shape()), to_string(target.shape()));
  if (ct.dtype() != target.dtype()) ct = astype(ct, target.dtype());
  auto it = cts.find(target.id());
  if (it == cts.end()) {
    cts.emplace(target.id(), ct);
  } else {
    // A value read more than once: its cotangents (same shape and dtype as the value,
    // checked above) are summed with AccumulateAdd (ir/primitives/elementwise.h).
    it->second = Array::make(target.shape(), target.dtype(), std::make_shared<AccumulateAdd>(), {it->second, ct});
  }
}

using CotangentFn = std::function<std::vector<Array>(const std::vector<Array>& outputs)>;

// Traces fun on identity tracers over the primals, then walks the dependent graph
// backwards applying each primitive's vjp rule. The output cotangents come from
// `make_cotangents(outputs)` (grad seeds ones once it has seen the output type).
std::pair<std::vector<Array>, std::vector<Array>> vjp_impl(const ArrayFn& fun, const std::vector<Array>& primals,
                                                           const CotangentFn& make_cotangents) {
  detail::TraceScope scope;
  std::vector<Array> tracers;
  for (const Array& p : primals)
    tracers.push_back(Array::make(p.shape(), p.dtype(), std::make_shared<Identity>(), {p}));
  std::vector<Array> outputs = fun(tracers);
  std::vector<Array> cotangents = make_cotangents(outputs);
  if (outputs.size() != cotangents.size())
    fail<ValueError>("vjp: the function returned {} outputs but {} cotangents were given", outputs.size(),
                     cotangents.size());
  detail::TracedGraph graph = detail::traced_graph(outputs, tracers);

  std::unordered_map<uint64_t, Array> cts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (cotangents[i].shape() != outputs[i].shape())
      fail<ShapeError>("vjp: cotangent {} has shape {} but output {} has shape {} (expected equal)", i,
                       to_string(cotangents[i].shape()), i, to_string(outputs[i].shape()));
    if (graph.depends(outputs[i]) && is_floating(outputs[i].dtype())) accumulate(cts, outputs[i], cotangents[i], "vjp");
  }

  for (auto node = graph.order.rbegin(); node != graph.order.rend(); ++node) {
    std::vector<Array> siblings = node->siblings();
    std::vector<Array> node_cts;
    bool any = false;
    for (const Array& s : siblings) {
      auto it = cts.find(s.id());
      node_cts.push_back(it == cts.end() ? Array() : it->second);
      any = any || it != cts.end();
    }
    if (!any) continue;
    if (siblings.size() == 1 && !node_cts[0].valid()) continue;
    const std::vector<Array>& inputs = node->inputs();
    std::vector<int> argnums;
    // Integer and boolean values carry no gradient (JAX semantics).
    for (size_t i = 0; i < inputs.size(); ++i)
      if (graph.depends(inputs[i]) && is_floating(inputs[i].dtype())) argnums.push_back(static_cast<int>(i));
    if (argnums.empty()) continue;
    const PrimitivePtr& prim = node->primitive();
    std::vector<Array> input_cts = prim->vjp(inputs, node_cts, argnums, siblings);
    if (input_cts.size() != argnums.size())
      fail<Error>("vjp rule of '{}' returned {} cotangents for {} inputs", prim->name(), input_cts.size(),
                  argnums.size());
    for (size_t k = 0; k < argnums.size(); ++k) accumulate(cts, inputs[argnums[k]], input_cts[k], prim->name().c_str());
    // Free cotangents of this node's outputs: nothing upstream reads them.
    for (const Array& s : siblings) cts.erase(s.id());
  }

  std::vector<Array> grads;
  for (size_t i = 0; i < primals.size(); ++i) {
    auto it = cts.find(tracers[i].id());
    grads.push_back(it == cts.end() ? zeros_like(primals[i]) : it->second);
  }
  return {outputs, grads};
}

}  // namespace

std::pair<std::vector<Array>, std::vector<Array>> vjp(const ArrayFn& fun, const std::vector<Array>& primals,
                                                      const std::vector<Array>& cotangents) {
  return vjp_impl(fun, primals, [&](const std::vector<Array>&) { return cotangents; });
}

namespace {

std::vector<int> resolve_argnums(std::vector<int> argnums, size_t n) {
  if (argnums.empty())
    for (size_t i = 0; i < n; ++i) argnums.push_back(static_cast<int>(i));
  for (int a : argnums)
    if (a < 0 || a >= static_cast<int>(n))
      fail<ValueError>("grad: argnum {} is out of range for a function of {} arguments", a, n);
  return argnums;
}

std::pair<Array, std::vector<Array>> value_and_grad_impl(const ScalarFn& fun, const std::vector<int>& argnums_in,
                                                         const std::vector<Array>& args) {
  std::vector<int> argnums = resolve_argnums(argnums_in, args.size());
  for (int a : argnums)
    if (!is_floating(args[a].dtype()))
      fail<TransformError>(
          "grad: argument {} has dtype {}; only floating inputs can be differentiated (exclude it "
          "with argnums, or cast it)",
          a, name(args[a].dtype()));
  std::vector<Array> diff;
  for (int a : argnums) diff.push_back(args[a]);
  auto wrapped = [&](const std::vector<Array>& xs) {
    std::vector<Array> full_args = args;
    for (size_t k = 0; k < argnums.size(); ++k) full_args[argnums[k]] = xs[k];
    Array out = fun(full_args);
    if (!is_floating(out.dtype()) || out.size() != 1)
      fail<TransformError>("grad: the function must return a floating scalar, got {} ({})", type_string(out),
                           is_floating(out.dtype()) ? "not a scalar; reduce it with sum or mean"
                                                    : "integer and boolean outputs are not differentiable");
    return std::vector<Array>{out};
  };
  auto [outs, grads] =
      vjp_impl(wrapped, diff, [](const std::vector<Array>& o) { return std::vector<Array>{ones_like(o[0])}; });
  return {outs[0], grads};
}

}  // namespace

std::function<std::pair<Array, std::vector<Array>>(const std::vector<Array>&)> value_and_grad(
    ScalarFn fun, std::vector<int> argnums) {
  return [fun = std::move(fun), argnums = std::move(argnums)](const std::vector<Array>& args) {
    return value_and_grad_impl(fun, argnums, args);
  };
}

std::function<std::vector<Array>(const std::vector<Array>&)> grad(ScalarFn fun, std::vector<int> argnums) {
  return [fun = std::move(fun), argnums = std::move(argnums)](const std::vector<Array>& args) {
    return value_and_grad_impl(fun, argnums, args).second;
  };
}

std::function<Array(const Array&)> grad(std::function<Array(const Array&)> fun) {
  return [fun = std::move(fun)](const Array& x) {
    return value_and_grad_impl([&](const std::vector<Array>& xs) { return fun(xs[0]); }, {}, {x}).second[0];
  };
}

std::function<std::pair<Array, Tree>(const Tree&)> value_and_grad(TreeFn fun) {
  return [fun = std::move(fun)](const Tree& params) {
    auto [value, grads] = value_and_grad_impl(
        [&](const std::vector<Array>& leaves) { return fun(params.with_leaves(leaves)); }, {}, params.leaves());
    return std::make_pair(value, params.with_leaves(grads));
  };
}

std::function<Tree(const Tree&)> grad(TreeFn fun) {
  auto vg = value_and_grad(std::move(fun));
  return [vg](const Tree& params) { return vg(params).second; };
}

}  // namespace tessera
