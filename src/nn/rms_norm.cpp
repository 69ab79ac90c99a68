#include "tessera/nn/rms_norm.h"

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::nn {

Tree RMSNorm::init(ParamScope scope) const {
  if (dim <= 0) fail<ValueError>("RMSNorm '{}': dim {} must be positive", scope.path(), dim);
  Tree p;
  p["scale"] =
      scope.param("scale", {.shape = {dim}, .axes = {"norm"}, .init = Initializer::ones(), .kind = ParamKind::Norm});
  return p;
}

Array RMSNorm::operator()(const Tree& p, const Array& x) const { return rms_norm(x, p.at("scale").leaf(), eps); }

}  // namespace tessera::nn
