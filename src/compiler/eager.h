// eval(): the unevaluated part of the lazy graph behind some arrays becomes a
// compiler Graph (evaluated arrays it reads are its parameters), compiled once per
// distinct graph text and cached, and run by the Executable engine: eager and
// jitted code share one execution path.
#pragma once

#include <vector>

#include "tessera/core/array.h"

namespace tessera::compiler {

void eval_arrays(const std::vector<Array>& arrays);

}  // namespace tessera::compiler
