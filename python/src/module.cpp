// The `tessera._tessera` extension module: each file of python/src/ registers one part;
// python/tessera/ is the package users import, built on it.
#include "bindings.h"

NB_MODULE(_tessera, m) {
  m.doc() = "tessera's C++ core (nanobind); import tessera, not this module";
  using namespace tessera::python;
  // Compiled functions hold Python callables (and they the arrays they close over) until
  // the interpreter's final teardown, after nanobind's leak check runs: that is not a leak.
  nb::set_leak_warnings(false);
  register_errors(m);
  register_conversions(m);
  register_array(m);
  register_ops(m);
  register_nn_ops(m);
  register_nn_modules(m);
  register_transforms(m);
  register_spmd(m);
  register_info(m);
  register_training(m);
  register_goodput(m);
  register_compilation_cache(m);
}
