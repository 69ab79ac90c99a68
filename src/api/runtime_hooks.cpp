// Installs the functions core reaches through core/runtime_hooks.h: graph evaluation
// (the compiler's eager path), reading sharded arrays (spmd/) and device arrays (the
// CUDA backend, or its CPU-only stand-in that explains why it cannot) on the host; and
// registers the collectives with the IR parser (spmd/ is above the compiler).
//
// This file is not archived into a library: CMake adds its object to the sources of
// every target that links `tessera` (INTERFACE_SOURCES), so its initializer runs in
// every program, whichever of tessera's symbols the program happens to use.
#include "tessera/core/runtime_hooks.h"

#include "compiler/eager.h"
#include "spmd/assemble.h"
#include "tessera/backend/device_data.h"
#include "tessera/spmd/collectives.h"

namespace tessera {
namespace {

const bool g_installed = [] {
  detail::install_graph_evaluator(&compiler::eval_arrays);
  detail::install_sharded_reader(&spmd::assemble_on_host);
  detail::install_device_reader(&backend::fetch_to_host);
  spmd::register_collective_parsers();
  return true;
}();

}  // namespace
}  // namespace tessera
