// Internal: the MPI communicator (one process per device, device == rank). Compiled
// only when CMake found MPI (TESSERA_HAS_MPI).
#pragma once

#include "tessera/spmd/communicator.h"

namespace tessera::spmd {

// The process's MPI communicator. The first call initializes MPI (MPI_Init_thread,
// unless the program already did) and registers MPI_Finalize at exit; it is never
// destroyed, so it outlives every static that could still use it.
Communicator& mpi_communicator();

}  // namespace tessera::spmd
