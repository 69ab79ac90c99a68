#include "tessera/nn/layer_norm.h"

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::nn {

Tree LayerNorm::init(ParamScope scope) const {
  if (dim <= 0) fail<ValueError>("LayerNorm '{}': dim {} must be positive", scope.path(), dim);
  Tree p;
  p["scale"] =
      scope.param("scale", {.shape = {dim}, .axes = {"norm"}, .init = Initializer::ones(), .kind = ParamKind::Norm});
  if (bias)
    p["bias"] =
        scope.param("bias", {.shape = {dim}, .axes = {"norm"}, .init = Initializer::zeros(), .kind = ParamKind::Norm});
  return p;
}

Array LayerNorm::operator()(const Tree& p, const Array& x) const {
  std::optional<Array> b;
  if (bias) b = p.at("bias").leaf();
  return layer_norm(x, p.at("scale").leaf(), b, eps);
}

}  // namespace tessera::nn
