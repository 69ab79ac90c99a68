// Function transforms: vjp, grad, value_and_grad, vmap. They compose: grad(grad(f)),
// vmap(grad(f)) (per-example gradients), and with jit (compiler layer).
//
// How they work: a transform calls the function on tracer arrays (identity nodes
// over the inputs for vjp, placeholders of the unbatched shape for vmap), which
// builds the graph lazily; it then walks that graph applying each primitive's vjp or
// batching rule. The rules build new lazy graphs, so transforms nest.
#pragma once

#include <climits>
#include <functional>
#include <utility>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/core/tree.h"

namespace tessera {

using ArrayFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
using ScalarFn = std::function<Array(const std::vector<Array>&)>;

// Outputs of fun(primals) and the cotangents of the primals given the outputs'
// cotangents (same shapes and dtypes as the outputs).
std::pair<std::vector<Array>, std::vector<Array>> vjp(const ArrayFn& fun, const std::vector<Array>& primals,
                                                      const std::vector<Array>& cotangents);

// Gradients of a scalar-valued fun w.r.t. the inputs in argnums (default: all).
// Integer inputs cannot be differentiated (TransformError); paths through integer
// or boolean values carry no gradient (like JAX).
std::function<std::vector<Array>(const std::vector<Array>&)> grad(ScalarFn fun, std::vector<int> argnums = {});
std::function<std::pair<Array, std::vector<Array>>(const std::vector<Array>&)> value_and_grad(
    ScalarFn fun, std::vector<int> argnums = {});
// Single-argument form: f(x) -> scalar, returns df/dx.
std::function<Array(const Array&)> grad(std::function<Array(const Array&)> fun);

// Tree forms: the gradient has the structure of the parameters.
using TreeFn = std::function<Array(const Tree&)>;
std::function<Tree(const Tree&)> grad(TreeFn fun);
std::function<std::pair<Array, Tree>(const Tree&)> value_and_grad(TreeFn fun);

// kNotMapped in in_axes: the input is shared by every batch element.
inline constexpr int kNotMapped = INT_MIN;
// Vectorizes fun over in_axes (default 0 for every input); outputs carry the batch
// at out_axes (default 0).
ArrayFn vmap(ArrayFn fun, std::vector<int> in_axes = {}, std::vector<int> out_axes = {});

}  // namespace tessera
