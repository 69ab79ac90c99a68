// Runtime: the devices of this process and the communicator that connects them.
//
//   * In-process (default): TESSERA_CPU_DEVICES=N virtual CPU devices (default 1),
//     or set_cpu_devices(N) before the first SPMD run. Every device runs on its own
//     thread; kernels inside a device thread run single-threaded when N > 1.
//   * MPI (multi-controller): started with mpirun, every rank runs the same
//     program and drives device == its rank (world size = number of ranks).
//
// run_on_devices runs a function once per local device with that device's
// DeviceContext current; collective primitives read it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/spmd/communicator.h"
#include "tessera/spmd/mesh.h"

namespace tessera::spmd {

// The device a thread is executing for, while inside run_on_devices.
struct DeviceContext {
  int device = 0;
  Communicator* communicator = nullptr;
};
// nullptr outside run_on_devices.
const DeviceContext* current_device();

// Number of devices of the world (all processes).
int device_count();
// Devices this process drives.
std::vector<int> local_devices();
// Every device of the world, 0 .. device_count()-1 (the group of a world-wide collective).
std::vector<int> world_group();
bool is_multi_process();
// Rank 0 (or the in-process runtime): the process that prints and writes files.
bool is_primary_process();
Communicator& communicator();
// "local (8 virtual CPU devices)" / "mpi (rank 1 of 4)".
std::string runtime_description();

// In-process runtime only: use n virtual devices from now on (n >= 1). Throws
// ValueError under MPI or while a run is in flight.
void set_cpu_devices(int n);

// Calls fn(device) for every local device in `devices` (a thread each when there are several),
// with current_device() set. The first exception thrown aborts the communicator
// (so no member hangs in a collective), is rethrown here after every thread ends,
// and the communicator is reset.
void run_on_devices(const std::vector<int>& devices, const std::function<void(int device)>& fn);

// Checks a mesh fits the world: mesh devices are 0 .. mesh.size()-1, so mesh.size()
// must not exceed device_count(). Throws ValueError "mesh (data=4, model=4) needs
// 16 devices but 8 are present (TESSERA_CPU_DEVICES=8)" otherwise.
void check_mesh(const Mesh& mesh);

}  // namespace tessera::spmd
