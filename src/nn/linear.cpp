#include "tessera/nn/linear.h"

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::nn {

Tree Linear::init(ParamScope scope) const {
  if (in <= 0 || out <= 0) fail<ValueError>("Linear '{}': in {} and out {} must be positive", scope.path(), in, out);
  if (axes.size() != 2)
    fail<ValueError>("Linear '{}': {} axis names (expected 2, for [in, out])", scope.path(), axes.size());
  Tree p;
  p["w"] = scope.param("w", {.shape = {in, out}, .axes = axes, .init = weight_init, .kind = ParamKind::Weight});
  if (bias)
    p["b"] =
        scope.param("b", {.shape = {out}, .axes = {axes[1]}, .init = Initializer::zeros(), .kind = ParamKind::Bias});
  return p;
}

Array Linear::operator()(const Tree& p, const Array& x) const {
  Array y = matmul(x, p.at("w").leaf());
  return bias ? y + p.at("b").leaf() : y;
}

}  // namespace tessera::nn
