// The text of configs/accelerators.toml, compiled in (CMake generates the definition from
// cmake/templates/accelerators_toml.cpp.in at configure time).
#pragma once

#include <string_view>

namespace tessera::goodput {

std::string_view accelerators_toml_text();

}  // namespace tessera::goodput
