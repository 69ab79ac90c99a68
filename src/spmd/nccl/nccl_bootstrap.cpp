// The NCCL communicator's bootstrap (see nccl_bootstrap.h): environment options and
// timeouts, the "file" bootstrap's id files, and Impl::init / select_device /
// exchange_id, which set up the world and hand a group's ncclUniqueId from its first
// member to the others over MPI or through a shared directory.
#include "spmd/nccl/nccl_bootstrap.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <system_error>
#include <thread>

#include "spmd/nccl/communicator_nccl_impl.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"

#if TESSERA_HAS_MPI
#include "spmd/mpi/communicator_mpi.h"
#endif

namespace tessera::spmd {
namespace nccl_detail {
namespace {

namespace fs = std::filesystem;

constexpr char kIdMagic[8] = {'T', 'S', 'R', 'N', 'C', 'C', 'L', '1'};

}  // namespace

const char* env(const char* name) {
  const char* value = flags::env(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// The first of `names` that is set, as an int (ValueError when it is not one); -1 if none.
int env_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* text = env(name);
    if (text == nullptr) continue;
    int value = 0;
    const char* end = text + std::strlen(text);
    const auto [ptr, ec] = std::from_chars(text, end, value);
    if (ec != std::errc() || ptr != end || value < 0)
      fail<ValueError>("NCCL communicator: {}={} is not a non-negative integer", name, text);
    return value;
  }
  return -1;
}

// `option` when it is >= 0, else the environment variable, else `fallback`.
double seconds_option(double option, const char* name, double fallback) {
  if (option >= 0) return option;
  const char* text = env(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0))
    fail<ValueError>("NCCL communicator: {}={} is not a number of seconds >= 0", name, text);
  return value;
}

bool launched_by_mpi() { return env("OMPI_COMM_WORLD_SIZE") != nullptr || env("PMI_SIZE") != nullptr; }

// ---- The file bootstrap ----

// `bytes` to `path`, atomically: readers see the whole file or none (a temporary name in
// the same directory, then rename).
void write_atomic(const fs::path& path, const std::string& bytes) { fileio::write_file_atomic(path, bytes); }

// The whole file, or false when it does not exist (yet).
bool read_file(const fs::path& path, std::string* bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  bytes->clear();
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes->append(buffer, n);
  std::fclose(f);
  return true;
}

// An id file: magic, the size of the group it connects, the id.
std::string encode_id(const ncclUniqueId& id, int members) {
  std::string bytes(sizeof kIdMagic + sizeof(int32_t) + sizeof id, '\0');
  const int32_t n = members;
  std::memcpy(bytes.data(), kIdMagic, sizeof kIdMagic);
  std::memcpy(bytes.data() + sizeof kIdMagic, &n, sizeof n);
  std::memcpy(bytes.data() + sizeof kIdMagic + sizeof n, &id, sizeof id);
  return bytes;
}

ncclUniqueId decode_id(const std::string& bytes, int members, const fs::path& path) {
  ncclUniqueId id;
  int32_t n = 0;
  if (bytes.size() != sizeof kIdMagic + sizeof n + sizeof id || std::memcmp(bytes.data(), kIdMagic, 8) != 0)
    fail<Error>("NCCL bootstrap: {} is not an id file written by tessera ({} bytes)", path.string(), bytes.size());
  std::memcpy(&n, bytes.data() + sizeof kIdMagic, sizeof n);
  if (n != members)
    fail<Error>(
        "NCCL bootstrap: {} is for {} ranks but this group has {} (a file left by an earlier run? use a fresh "
        "bootstrap directory per run)",
        path.string(), n, members);
  std::memcpy(&id, bytes.data() + sizeof kIdMagic + sizeof n, sizeof id);
  return id;
}

// "nccl-world.id", "nccl-group-0_2_4.id" (a hash when the list is long).
std::string id_file_name(const std::vector<int>& group, bool world) {
  if (world) return "nccl-world.id";
  std::string members = fmt::format("{}", fmt::join(group, "_"));
  if (members.size() > 120) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (char c : members) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    members = fmt::format("{}members-{:016x}", group.size(), h);
  }
  return fmt::format("nccl-group-{}.id", members);
}

}  // namespace nccl_detail

using namespace nccl_detail;  // NOLINT(build/namespaces): the NCCL files' shared helpers
namespace fs = std::filesystem;

// ---- NcclCommunicator::Impl: setup ----

void NcclCommunicator::Impl::init(const NcclOptions& options) {
  timeout = seconds_option(options.timeout_s, "TESSERA_NCCL_TIMEOUT_S", kDefaultTimeout);
  bootstrap_timeout =
      seconds_option(options.bootstrap_timeout_s, "TESSERA_NCCL_BOOTSTRAP_TIMEOUT_S", kDefaultBootstrapTimeout);
  std::string mode = options.bootstrap;
  if (mode.empty() && env("TESSERA_NCCL_BOOTSTRAP") != nullptr) mode = env("TESSERA_NCCL_BOOTSTRAP");
  if (!mode.empty() && mode != "mpi" && mode != "file")
    fail<ValueError>("NCCL communicator: unknown bootstrap '{}' (expected 'mpi' or 'file')", mode);
#if !TESSERA_HAS_MPI
  if (mode == "mpi") fail<ValueError>("NCCL communicator: bootstrap 'mpi' needs a build with MPI");
#endif
  if (mode.empty()) {
#if TESSERA_HAS_MPI
    if (launched_by_mpi()) mode = "mpi";
#endif
    if (mode.empty()) mode = "file";
  }

  if (mode == "mpi") {
#if TESSERA_HAS_MPI
    // The MPI communicator initializes MPI (once per process) and ends it at exit: with
    // MPI_Abort when aborted, which abort() below arranges.
    mpi_communicator();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if ((options.rank >= 0 && options.rank != rank) || (options.world_size >= 0 && options.world_size != size))
      fail<ValueError>("NCCL communicator: options say rank {} of {}, but MPI says rank {} of {}", options.rank,
                       options.world_size, rank, size);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &boot_comm) != MPI_SUCCESS ||
        MPI_Comm_dup(MPI_COMM_WORLD, &abort_comm) != MPI_SUCCESS)
      fail<Error>("NCCL communicator: MPI_Comm_dup failed");
    boot = size > 1 ? Boot::Mpi : Boot::None;
#endif
  } else {
    rank = options.rank >= 0 ? options.rank : env_int({"TESSERA_NCCL_RANK", "RANK", "OMPI_COMM_WORLD_RANK"});
    size = options.world_size >= 0 ? options.world_size
                                   : env_int({"TESSERA_NCCL_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
    if (rank < 0) rank = 0;
    if (size < 0) size = 1;
    if (size < 1 || rank >= size)
      fail<ValueError>("NCCL communicator: rank {} of a world of {} (expected 0 <= rank < world size)", rank, size);
    boot = size > 1 ? Boot::File : Boot::None;
    if (boot == Boot::File) {
      std::string where = options.bootstrap_dir;
      if (where.empty() && env("TESSERA_NCCL_BOOTSTRAP_DIR") != nullptr) where = env("TESSERA_NCCL_BOOTSTRAP_DIR");
      if (where.empty())
        fail<ValueError>(
            "NCCL communicator: rank {} of {} needs a bootstrap: run under mpirun (MPI build) or set "
            "TESSERA_NCCL_BOOTSTRAP_DIR to a fresh directory every rank can see",
            rank, size);
      dir = where;
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) fail<Error>("NCCL bootstrap: cannot create directory {}: {}", dir.string(), ec.message());
    }
  }

  // From here on a failure tells the peers (their waits end instead of timing out).
  try {
    // The id first: it needs no GPU, and a rank without one then fails in the open
    // (its peers see its abort note) instead of before the bootstrap.
    const std::vector<int> everyone = all_ranks();
    const ncclUniqueId id = exchange_id(everyone, /*is_world=*/true);
    select_device(options);
    DeviceGuard guard(device);
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    world = init_comm(id, everyone, rank, "ncclCommInitRankConfig (world)");
  } catch (const std::exception& e) {
    abort_all(fmt::format("rank {}: creating the NCCL communicator failed: {}", rank, e.what()), true);
    throw;
  }
}

void NcclCommunicator::Impl::select_device(const NcclOptions& options) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) (void)cudaGetLastError();
  if (status != cudaSuccess || count == 0)
    fail<Error>("rank {} has no CUDA device ({})", rank,
                status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount: 0");
  if (options.device >= 0) {
    if (options.device >= count) fail<ValueError>("device {} requested but {} are visible", options.device, count);
    device = options.device;
    return;
  }
  int local = options.local_rank >= 0
                  ? options.local_rank
                  : env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"});
  if (local < 0) local = rank;
  device = local % count;
}

ncclUniqueId NcclCommunicator::Impl::exchange_id(const std::vector<int>& group, bool is_world) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  const bool root = group.front() == rank;
  const fs::path path = boot == Boot::File ? dir / id_file_name(group, is_world) : fs::path();
  if (root && boot == Boot::File && group.size() > 1 && fs::exists(path))
    fail<Error>("NCCL bootstrap: {} already exists (left by an earlier run?): use a fresh bootstrap directory per run",
                path.string());
  if (root) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess)
      fail<Error>("NCCL: ncclGetUniqueId failed: {} ({})", ncclGetErrorString(result), ncclGetLastError(nullptr));
  }
  if (group.size() == 1 || boot == Boot::None) return id;
  const char* op = is_world ? "bootstrap (world id)" : "bootstrap (group id)";
  if (boot == Boot::File) {
    if (root) {
      write_atomic(path, encode_id(id, static_cast<int>(group.size())));
      return id;
    }
    std::string bytes;
    const double start = now_seconds();
    for (int spins = 0; !read_file(path, &bytes); ++spins) {
      poll_peer_abort();
      if (is_aborted) throw_aborted(op, group);
      if (now_seconds() - start > bootstrap_timeout)
        fail<Error>(
            "NCCL bootstrap: rank {} waited {:.3g} s for {} (written by rank {}, the group's first member): is "
            "rank {} running, with the same TESSERA_NCCL_BOOTSTRAP_DIR? (TESSERA_NCCL_BOOTSTRAP_TIMEOUT_S)",
            rank, bootstrap_timeout, path.string(), group.front(), group.front());
      std::this_thread::sleep_for(std::chrono::milliseconds(spins < 100 ? 1 : 10));
    }
    return decode_id(bytes, static_cast<int>(group.size()), path);
  }
#if TESSERA_HAS_MPI
  // On the heap: if the wait throws, MPI may still touch the buffer (it is then left
  // alone; the job ends with MPI_Abort).
  auto buffer = std::make_unique<ncclUniqueId>(id);
  std::vector<MPI_Request> requests;
  if (root) {
    for (size_t j = 1; j < group.size(); ++j) {
      requests.emplace_back();
      if (MPI_Isend(buffer.get(), sizeof id, MPI_BYTE, group[j], kIdTag, boot_comm, &requests.back()) != MPI_SUCCESS)
        fail<Error>("NCCL bootstrap: MPI_Isend of the id failed");
    }
  } else {
    requests.emplace_back();
    if (MPI_Irecv(buffer.get(), sizeof id, MPI_BYTE, group.front(), kIdTag, boot_comm, &requests.back()) != MPI_SUCCESS)
      fail<Error>("NCCL bootstrap: MPI_Irecv of the id failed");
  }
  try {
    for (MPI_Request& request : requests)
      wait_until(
          [&] {
            int done = 0;
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
            return done != 0;
          },
          op, group, bootstrap_timeout);
  } catch (...) {
    (void)buffer.release();
    throw;
  }
  id = *buffer;
#endif
  return id;
}

}  // namespace tessera::spmd
