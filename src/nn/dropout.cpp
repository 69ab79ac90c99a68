#include "tessera/nn/dropout.h"

#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/core/random.h"

namespace tessera::nn {

Array Dropout::operator()(const Array& x, const std::optional<Array>& key) const {
  if (!(rate >= 0 && rate <= 1)) fail<ValueError>("Dropout: rate {} must be in [0, 1]", rate);
  if (!key || rate == 0) return x;
  if (rate == 1) return zeros_like(x);
  Array keep = random::bernoulli(*key, 1 - rate, x.shape());
  return where(keep, x * (1 / (1 - rate)), zeros_like(x));
}

}  // namespace tessera::nn
