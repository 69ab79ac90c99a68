#pragma once

namespace tessera {
// "0.1.0": the library version (also part of compilation-cache keys later).
const char* version();
}  // namespace tessera
