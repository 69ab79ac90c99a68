// vmap: trace the function on placeholders of the per-example shape, then replay
// the traced graph with each primitive's batching rule.
#include <unordered_map>

#include "core/graph_walk.h"
#include "core/trace_state.h"
#include "tessera/core/ops.h"
#include "tessera/core/transforms.h"

namespace tessera {

ArrayFn vmap(ArrayFn fun, std::vector<int> in_axes_arg, std::vector<int> out_axes_arg) {
  return [fun = std::move(fun), in_axes_arg, out_axes_arg](const std::vector<Array>& inputs) {
    std::vector<int> in_axes = in_axes_arg.empty() ? std::vector<int>(inputs.size(), 0) : in_axes_arg;
    if (in_axes.size() != inputs.size())
      fail<ValueError>("vmap: {} in_axes for {} inputs (expected one per input)", in_axes.size(), inputs.size());
    int64_t size = -1;
    size_t size_from = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (in_axes[i] == kNotMapped) continue;
      in_axes[i] = normalize_axis(in_axes[i], inputs[i].ndim(), "vmap");
      int64_t n = inputs[i].shape()[in_axes[i]];
      if (size >= 0 && n != size)
        fail<ShapeError>(
            "vmap: input {} has size {} at axis {} but input {} has size {} at axis {} (mapped axes "
            "must have equal sizes)",
            size_from, size, in_axes[size_from], i, n, in_axes[i]);
      size = n;
      size_from = i;
    }
    if (size < 0) fail<ValueError>("vmap: no input is mapped (every in_axes entry is kNotMapped)");

    detail::TraceScope scope;
    std::vector<Array> traced, args;
    std::unordered_map<uint64_t, std::pair<Array, int>> mapped;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (in_axes[i] == kNotMapped) {
        args.push_back(inputs[i]);
        continue;
      }
      Shape shape = inputs[i].shape();
      shape.erase(shape.begin() + in_axes[i]);
      Array p = Array::placeholder(shape, inputs[i].dtype());
      traced.push_back(p);
      args.push_back(p);
      mapped.emplace(p.id(), std::make_pair(inputs[i], in_axes[i]));
    }
    std::vector<Array> outputs = fun(args);
    detail::TracedGraph graph = detail::traced_graph(outputs, traced);

    for (const Array& node : graph.order) {
      std::vector<Array> ins;
      std::vector<int> axes;
      for (const Array& in : node.inputs()) {
        auto it = mapped.find(in.id());
        ins.push_back(it == mapped.end() ? in : it->second.first);
        axes.push_back(it == mapped.end() ? -1 : it->second.second);
      }
      auto [outs, out_axes] = node.primitive()->vmap(ins, axes);
      std::vector<Array> siblings = node.siblings();
      if (outs.size() != siblings.size())
        fail<Error>("vmap rule of '{}' returned {} outputs (expected {})", node.primitive()->name(), outs.size(),
                    siblings.size());
      for (size_t k = 0; k < siblings.size(); ++k) mapped[siblings[k].id()] = {outs[k], out_axes[k]};
    }

    std::vector<int> out_axes = out_axes_arg.empty() ? std::vector<int>(outputs.size(), 0) : out_axes_arg;
    if (out_axes.size() != outputs.size())
      fail<ValueError>("vmap: {} out_axes for {} outputs", out_axes.size(), outputs.size());
    std::vector<Array> results;
    for (size_t i = 0; i < outputs.size(); ++i) {
      int dest = normalize_axis(out_axes[i], outputs[i].ndim() + 1, "vmap (out_axes)");
      auto it = mapped.find(outputs[i].id());
      if (it == mapped.end()) {
        // Output independent of the mapped inputs: the same value for every example.
        Shape shape = outputs[i].shape();
        shape.insert(shape.begin(), size);
        results.push_back(moveaxis(broadcast_to(outputs[i], shape), 0, dest));
      } else {
        results.push_back(moveaxis(it->second.first, it->second.second, dest));
      }
    }
    return results;
  };
}

}  // namespace tessera
