// The SPMD runtime: which devices this process drives and the communicator between
// them (in-process by default, MPI under mpirun, TCP when TESSERA_COORDINATOR names a
// TCP job's rank 0), and run_on_devices.
#include "tessera/spmd/runtime.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "spmd/communicator_local.h"
#include "spmd/tcp/communicator_tcp.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/thread_pool.h"
#if TESSERA_HAS_MPI
#include "spmd/mpi/communicator_mpi.h"
#endif

namespace tessera::spmd {
namespace {

thread_local const DeviceContext* t_context = nullptr;

// mpirun (OpenMPI), a PMI launcher (MPICH, Slurm's --mpi=pmi2) or a PMIx one (Slurm's
// srun --mpi=pmix, OpenMPI ranks started directly) started this process.
bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

int devices_from_env() {
  return static_cast<int>(flags::env_integer("TESSERA_CPU_DEVICES", 1, 1, 4096, "a device count"));
}

struct Runtime {
  std::mutex mutex;
  Communicator* active = nullptr;
  bool mpi = false;  // one process per device (MPI or TCP)
  std::unique_ptr<LocalCommunicator> local;
  // Communicators replaced by set_cpu_devices stay alive: a caller may still hold a
  // reference from communicator().
  std::vector<std::unique_ptr<LocalCommunicator>> retired;
  std::atomic<int> runs_in_flight{0};
};

Runtime& runtime() {
  static Runtime* instance = new Runtime();  // never destroyed: device threads may outlive statics
  return *instance;
}

// The communicator, created on first use.
Communicator& active_communicator() {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  if (!rt.active) {
    if (tcp_requested()) {
      if (launched_by_mpi())
        fail<ValueError>(
            "TESSERA_COORDINATOR is set (a TCP job) but mpirun started this process: unset one (tessera launch "
            "--coordinator starts its own processes)");
      rt.active = &tcp_communicator();
      rt.mpi = true;
      return *rt.active;
    }
#if TESSERA_HAS_MPI
    if (launched_by_mpi()) {
      rt.active = &mpi_communicator();
      rt.mpi = true;
      return *rt.active;
    }
#endif
#if !TESSERA_HAS_MPI
    if (launched_by_mpi())
      std::fprintf(stderr,
                   "tessera: started by mpirun, but this build has no MPI: every process runs the in-process "
                   "runtime on its own\n");
#endif
    rt.local = std::make_unique<LocalCommunicator>(devices_from_env());
    rt.active = rt.local.get();
  }
  return *rt.active;
}

}  // namespace

const DeviceContext* current_device() { return t_context; }

Communicator& communicator() { return active_communicator(); }

int device_count() { return communicator().world_size(); }

std::vector<int> local_devices() { return communicator().local_devices(); }

bool is_multi_process() {
  communicator();
  return runtime().mpi;
}

std::vector<int> world_group() {
  std::vector<int> group(static_cast<size_t>(device_count()));
  for (size_t i = 0; i < group.size(); ++i) group[i] = static_cast<int>(i);
  return group;
}

bool is_primary_process() {
  Communicator& comm = communicator();
  return !runtime().mpi || comm.local_devices().front() == 0;
}

std::string runtime_description() {
  Communicator& comm = communicator();
  if (runtime().mpi)
    return fmt::format("{} (rank {} of {})", comm.kind(), comm.local_devices().front(), comm.world_size());
  const int n = comm.world_size();
  return fmt::format("local ({} virtual CPU device{})", n, n == 1 ? "" : "s");
}

void set_cpu_devices(int n) {
  if (n < 1) fail<ValueError>("set_cpu_devices: {} devices (expected at least 1)", n);
  communicator();  // decides between MPI and in-process first
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  if (rt.mpi)
    fail<ValueError>(
        "set_cpu_devices({}): this process is one rank of a {} job (a rank per device; the world size is set by "
        "its launcher)",
        n, rt.active->kind());
  if (rt.runs_in_flight.load() > 0)
    fail<ValueError>("set_cpu_devices({}): a run_on_devices call is in flight (change the device count between runs)",
                     n);
  if (rt.local && rt.local->world_size() == n) return;
  if (rt.local) rt.retired.push_back(std::move(rt.local));
  rt.local = std::make_unique<LocalCommunicator>(n);
  rt.active = rt.local.get();
}

void run_on_devices(const std::vector<int>& devices, const std::function<void(int device)>& fn) {
  if (t_context)
    fail<ValueError>("run_on_devices: called from device {}'s thread (nested SPMD runs are not supported)",
                     t_context->device);
  Communicator& comm = communicator();
  const std::vector<int> mine = comm.local_devices();
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    fail<ValueError>("run_on_devices: devices {} list a device twice", devices);
  for (int d : devices)
    if (std::find(mine.begin(), mine.end(), d) == mine.end())
      fail<ValueError>("run_on_devices: device {} is not driven by this process ({}; local devices {})", d,
                       runtime_description(), mine);
  if (devices.empty()) return;

  Runtime& rt = runtime();
  auto* local = dynamic_cast<LocalCommunicator*>(&comm);
  {
    std::lock_guard<std::mutex> lock(rt.mutex);
    ++rt.runs_in_flight;
    if (local) local->begin_run(devices);
  }
  std::mutex error_mutex;
  std::exception_ptr error;
  const bool serial = devices.size() > 1;
  auto body = [&](int device) {
    DeviceContext context{device, &comm};
    t_context = &context;
    try {
      if (serial) {
        SerialKernelsScope scope;  // the device threads already keep every core busy
        fn(device);
      } else {
        fn(device);
      }
    } catch (...) {
      std::string what = "unknown exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      // Wake every member waiting in a collective (they throw and end too).
      comm.abort(fmt::format("device {} failed: {}", device, what));
    }
    t_context = nullptr;
  };
  if (devices.size() == 1) {
    body(devices[0]);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(devices.size());
    try {
      for (int d : devices) threads.emplace_back(body, d);
    } catch (...) {  // no thread for a device: the started ones must not wait for it
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      comm.abort("run_on_devices could not start a device thread");
    }
    for (std::thread& t : threads) t.join();
  }
  {
    std::lock_guard<std::mutex> lock(rt.mutex);
    if (local) local->end_run(devices);
    if (error) comm.reset();
    --rt.runs_in_flight;
  }
  if (error) std::rethrow_exception(error);
}

void check_mesh(const Mesh& mesh) {
  const int n = device_count();
  if (mesh.size() <= n) return;
  const std::string how = !is_multi_process()              ? fmt::format("TESSERA_CPU_DEVICES={}", n)
                          : communicator().kind() == "tcp" ? fmt::format("a TCP job of {} ranks", n)
                                                           : fmt::format("mpirun -n {}", n);
  fail<ValueError>("mesh {} needs {} devices but {} are present ({})", mesh.to_string(), mesh.size(), n, how);
}

}  // namespace tessera::spmd
