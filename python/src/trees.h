// C++ Trees <-> Python pytrees (dicts with str keys, lists/tuples, array leaves).
#pragma once

#include <string>

#include "bindings.h"
#include "tessera/core/tree.h"

namespace tessera::python {

// `path` names the position in errors ("layers.0.w").
Tree to_tree(nb::handle value, const std::string& path = "");
nb::object from_tree(const Tree& tree);

}  // namespace tessera::python
