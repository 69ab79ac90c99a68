#include "tessera/nn/embedding.h"

#include "tessera/base/error.h"
#include "tessera/core/ops.h"

namespace tessera::nn {

Tree Embedding::init(ParamScope scope) const {
  if (vocab <= 0 || dim <= 0)
    fail<ValueError>("Embedding '{}': vocab {} and dim {} must be positive", scope.path(), vocab, dim);
  Tree p;
  p["w"] = scope.param("w", {.shape = {vocab, dim}, .axes = axes, .init = weight_init, .kind = ParamKind::Embedding});
  return p;
}

Array Embedding::operator()(const Tree& p, const Array& ids) const { return take(p.at("w").leaf(), ids, 0); }

Array Embedding::attend(const Tree& p, const Array& x) const { return matmul(x, transpose(p.at("w").leaf())); }

}  // namespace tessera::nn
