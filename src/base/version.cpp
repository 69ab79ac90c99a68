#include "tessera/base/version.h"

namespace tessera {
const char* version() { return "0.1.0"; }
}  // namespace tessera
