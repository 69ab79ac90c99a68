// tessera.info(), tessera.__version__, and the import-time CPU check: the same report and
// the same refusal `tessera info` and the tessera binary give (src/cli/info_text.cpp and
// src/cli/cpu_check.cpp are compiled into the extension, without AVX2 flags).
#include "bindings.h"
#include "cli/cpu_check.h"
#include "cli/info_text.h"
#include "tessera/base/thread_pool.h"
#include "tessera/base/version.h"

namespace tessera::python {

void register_info(nb::module_& m) {
  m.def("info_text", &cli::info_text, "What `tessera info` prints: version, threads, BLAS, CPU, devices, CUDA.");
  m.def("_cpu_mismatch_message", &cli::cpu_mismatch_message);
  m.def("num_threads", &num_threads, "Threads of tessera's CPU pool (TESSERA_NUM_THREADS).");
  m.attr("__version__") = std::string(version());
}

}  // namespace tessera::python
