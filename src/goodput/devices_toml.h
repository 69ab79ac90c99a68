// The text of configs/devices.toml, compiled in (CMake generates the definition from
// cmake/templates/devices_toml.cpp.in at configure time).
#pragma once

#include <string_view>

namespace tessera::goodput {

std::string_view devices_toml_text();

}  // namespace tessera::goodput
