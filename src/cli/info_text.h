// What this build is and what it runs on, as `tessera info` prints it.
#pragma once

#include <string>

namespace tessera::cli {

// Version, threads, BLAS, CPU features, devices, MPI and CUDA, one line each.
std::string info_text();

}  // namespace tessera::cli
