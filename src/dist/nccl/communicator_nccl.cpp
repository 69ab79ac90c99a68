// The NCCL communicator: see communicator_nccl.h for what it promises. In short: one
// process (or thread) per GPU, non-blocking NCCL communicators polled by every wait, so
// an abort (ours, a peer's, a timeout) ends every wait with an error instead of a hang.
#include "dist/nccl/communicator_nccl.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "backend/cuda/cuda_check.h"
#include "dist/communicator_local.h"
#include "tessera/base/error.h"

#if TESSERA_HAS_MPI
#include <mpi.h>

#include "dist/mpi/communicator_mpi.h"
#endif

namespace tessera::dist {
namespace {

namespace fs = std::filesystem;

constexpr double kDefaultTimeout = 600;
constexpr double kDefaultBootstrapTimeout = 300;
constexpr char kIdMagic[8] = {'T', 'S', 'R', 'N', 'C', 'C', 'L', '1'};
#if TESSERA_HAS_MPI
constexpr int kAbortTag = 7101;
constexpr int kIdTag = 7102;
#endif

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Spins briefly, then yields, then sleeps: waits often last milliseconds, and ranks can
// share cores.
void backoff(int spins) {
  if (spins > 1024)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  else if (spins > 64)
    std::this_thread::yield();
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
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

#if TESSERA_HAS_MPI
bool launched_by_mpi() { return env("OMPI_COMM_WORLD_SIZE") != nullptr || env("PMI_SIZE") != nullptr; }
#endif

ncclDataType_t nccl_sum_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Float16:
      return ncclFloat16;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    default:
      fail<DTypeError>("{}: cannot sum {} values (expected float32, float64, bfloat16, float16, int32 or int64)", op,
                       name(dtype));
  }
}

// Same order as communicator_local.cpp and communicator_mpi.cpp: dst = ((src[0] + src[1]) + ...).
void ordered_sum(void* dst, const std::vector<const char*>& srcs, size_t count, DType dtype) {
  const size_t item = itemsize(dtype);
  constexpr size_t kTile = 4096;
  char* out = static_cast<char*>(dst);
  for (size_t begin = 0; begin < count; begin += kTile) {
    const size_t len = std::min(kTile, count - begin);
    std::memcpy(out + begin * item, srcs[0] + begin * item, len * item);
    for (size_t j = 1; j < srcs.size(); ++j) add_into(out + begin * item, srcs[j] + begin * item, len, dtype);
  }
}

// ---- The file bootstrap ----

// `bytes` to `path`, atomically: readers see the whole file or none (a temporary name in
// the same directory, then rename).
void write_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path temp = path.parent_path() / fmt::format(".{}.tmp.{}.{}", path.filename().string(), ::getpid(),
                                                         std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) fail<Error>("NCCL bootstrap: cannot create {}: {}", temp.string(), std::strerror(errno));
  const bool ok =
      std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) {
    std::remove(temp.c_str());
    fail<Error>("NCCL bootstrap: cannot write {}: {}", temp.string(), std::strerror(err));
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    std::remove(temp.c_str());
    fail<Error>("NCCL bootstrap: cannot rename {} to {}: {}", temp.string(), path.string(), ec.message());
  }
}

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

// Makes the current thread's device `device` for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TESSERA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) TESSERA_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0, device_ = 0;
};

enum class Boot { None, Mpi, File };

}  // namespace

struct NcclCommunicator::Impl {
  int rank = 0, size = 1, device = 0;
  Boot boot = Boot::None;
  fs::path dir;
  double timeout = kDefaultTimeout, bootstrap_timeout = kDefaultBootstrapTimeout;
  cudaStream_t stream = nullptr;

  // Every NCCL call holds nccl_mutex, so abort() (any thread) never frees a communicator
  // another thread is using; waits take it once per poll.
  std::mutex nccl_mutex;
  ncclComm_t world = nullptr;
  std::map<std::vector<int>, ncclComm_t> groups;  // group (in group order) -> its communicator

  mutable std::mutex state_mutex;  // reason, stats
  std::atomic<bool> is_aborted{false};
  std::string reason;
  CommStats stats;
  double next_file_poll = 0;

  // Host-API staging on the device (grow-only; every host call waits before returning).
  char* staging = nullptr;
  size_t staging_bytes = 0;

#if TESSERA_HAS_MPI
  MPI_Comm boot_comm = MPI_COMM_NULL;   // ids
  MPI_Comm abort_comm = MPI_COMM_NULL;  // abort notes
#endif

  ~Impl() {
    try {
      destroy_comms();
    } catch (...) {
    }
    if (staging != nullptr) cudaFree(staging);
    if (stream != nullptr) cudaStreamDestroy(stream);
#if TESSERA_HAS_MPI
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (boot_comm != MPI_COMM_NULL) MPI_Comm_free(&boot_comm);
      if (abort_comm != MPI_COMM_NULL) MPI_Comm_free(&abort_comm);
    }
#endif
  }

  // ---- setup ----

  void init(const NcclOptions& options) {
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

  // The GPU, before any NCCL call (ncclCommInitRank binds the current device).
  void select_device(const NcclOptions& options) {
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

  std::vector<int> all_ranks() const {
    std::vector<int> everyone(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) everyone[static_cast<size_t>(r)] = r;
    return everyone;
  }

  // group[0] makes an id and hands it to the other members.
  ncclUniqueId exchange_id(const std::vector<int>& group, bool is_world) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    const bool root = group.front() == rank;
    const fs::path path = boot == Boot::File ? dir / id_file_name(group, is_world) : fs::path();
    if (root && boot == Boot::File && group.size() > 1 && fs::exists(path))
      fail<Error>(
          "NCCL bootstrap: {} already exists (left by an earlier run?): use a fresh bootstrap directory per run",
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
      if (MPI_Irecv(buffer.get(), sizeof id, MPI_BYTE, group.front(), kIdTag, boot_comm, &requests.back()) !=
          MPI_SUCCESS)
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

  static ncclConfig_t config() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; waits poll (see the header)
    return config;
  }

  // A member's communicator for `group` (it is member `index`), waited for.
  ncclComm_t init_comm(const ncclUniqueId& id, const std::vector<int>& group, int index, const char* what) {
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex);
      if (is_aborted) throw_aborted(what, group);
      ncclConfig_t cfg = config();
      ncclUniqueId copy = id;
      const ncclResult_t result = ncclCommInitRankConfig(&comm, static_cast<int>(group.size()), copy, index, &cfg);
      if (result != ncclSuccess && result != ncclInProgress) {
        const std::string last = ncclGetLastError(comm);
        if (comm != nullptr) ncclCommAbort(comm);
        fail<Error>("NCCL: {} failed: {} ({})", what, ncclGetErrorString(result), last);
      }
    }
    try {
      wait_comm_ready(comm, what, group);
    } catch (...) {
      // Not stored anywhere yet, so abort_all did not abort it: stop its setup here.
      std::lock_guard<std::mutex> lock(nccl_mutex);
      ncclCommAbort(comm);
      throw;
    }
    return comm;
  }

  // ---- waiting ----

  // Polls `ready` until true, watching the abort channel and the timeout; throws when aborted.
  void wait_until(const std::function<bool()>& ready, const char* op, const std::vector<int>& group, double limit) {
    const double start = now_seconds();
    for (int spins = 0;; ++spins) {
      poll_peer_abort();  // first: a peer's reason beats the error its abort causes here
      if (is_aborted) throw_aborted(op, group);
      if (ready()) return;
      if (is_aborted) throw_aborted(op, group);
      if (limit > 0 && now_seconds() - start > limit) {
        abort_all(fmt::format("rank {}: {} on devices {} did not finish within {:.3g} s (TESSERA_NCCL_TIMEOUT_S)", rank,
                              op, group, limit),
                  true);
        throw_aborted(op, group);
      }
      backoff(spins);
    }
  }

  // One poll of a communicator's state: true when it is idle and healthy, false while an
  // operation is still being set up; an error aborts everything and throws.
  bool comm_ready(ncclComm_t comm, const char* op, const std::vector<int>& group) {
    ncclResult_t state = ncclSuccess;
    std::string last;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex);
      if (is_aborted) return false;  // the caller's loop throws
      const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
      if (result != ncclSuccess) state = result;
      if (state != ncclSuccess && state != ncclInProgress) last = ncclGetLastError(comm);
    }
    if (state == ncclSuccess) return true;
    if (state == ncclInProgress) return false;
    // A peer that aborted makes NCCL fail here too: prefer its note (its reason), which
    // it sends before aborting its NCCL communicators; give an MPI note a moment to arrive.
    for (const double until = now_seconds() + 0.2; !is_aborted && now_seconds() < until;) {
      poll_peer_abort(/*now=*/true);
      if (!is_aborted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!is_aborted)
      abort_all(fmt::format("rank {}: NCCL error in {} on devices {}: {} ({})", rank, op, group,
                            ncclGetErrorString(state), last),
                true);
    throw_aborted(op, group);
  }

  void wait_comm_ready(ncclComm_t comm, const char* op, const std::vector<int>& group) {
    wait_until([&] { return comm_ready(comm, op, group); }, op, group, timeout);
  }

  // Everything queued on `s` has run; NCCL errors and peers' aborts are watched meanwhile.
  void wait_stream(cudaStream_t s, ncclComm_t comm, const char* op, const std::vector<int>& group) {
    wait_until(
        [&] {
          if (comm != nullptr && !comm_ready(comm, op, group)) return false;
          const cudaError_t status = cudaStreamQuery(s);
          if (status == cudaSuccess) return true;
          if (status == cudaErrorNotReady) return false;
          (void)cudaGetLastError();
          abort_all(fmt::format("rank {}: CUDA error in {} on devices {}: {} ({})", rank, op, group,
                                cudaGetErrorName(status), cudaGetErrorString(status)),
                    true);
          return false;  // aborted: the loop throws
        },
        op, group, timeout);
  }

  // ---- abort ----

  // A peer's note: MPI message or <dir>/abort.
  // Rate-limited for the file (a stat per 10 ms) unless `now`.
  void poll_peer_abort(bool now = false) {
    if (is_aborted) return;
#if TESSERA_HAS_MPI
    if (boot == Boot::Mpi) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, abort_comm, &flag, &status);
      if (!flag) return;
      int length = 0;
      MPI_Get_count(&status, MPI_CHAR, &length);
      std::string text(static_cast<size_t>(std::max(0, length)), '\0');
      MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, kAbortTag, abort_comm, MPI_STATUS_IGNORE);
      abort_all(text, false);
      return;
    }
#endif
    if (boot == Boot::File) {
      const double t = now_seconds();
      if (!now && t < next_file_poll) return;
      next_file_poll = t + 0.01;
      std::string text;
      if (read_file(dir / "abort", &text)) abort_all(text.empty() ? "a peer aborted" : text, false);
    }
  }

  // Marks the communicator aborted (first reason wins), tells the peers when
  // `tell_peers`, and aborts every NCCL communicator.
  void abort_all(const std::string& why, bool tell_peers) {
    {
      std::lock_guard<std::mutex> lock(state_mutex);
      if (is_aborted) return;
      reason = why;
      is_aborted = true;
    }
    if (tell_peers) {
      try {
        tell_peers_about(why);
      } catch (...) {  // best effort: the timeout still ends the peers' waits
      }
    }
#if TESSERA_HAS_MPI
    // So the job ends with MPI_Abort at exit instead of a hanging MPI_Finalize.
    if (boot == Boot::Mpi) {
      try {
        mpi_communicator().abort(why);
      } catch (...) {
      }
    }
#endif
    std::lock_guard<std::mutex> lock(nccl_mutex);
    for (auto& [group, comm] : groups)
      if (comm != nullptr) ncclCommAbort(comm);
    groups.clear();
    if (world != nullptr) ncclCommAbort(world);
    world = nullptr;
  }

  void tell_peers_about(const std::string& why) {
#if TESSERA_HAS_MPI
    if (boot == Boot::Mpi || (boot == Boot::None && abort_comm != MPI_COMM_NULL)) {
      // Never waited for (the job ends at exit with MPI_Abort), so the text must outlive
      // this object: a copy that is never freed.
      const std::string* note = new std::string(why);
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        MPI_Request request;
        if (MPI_Isend(note->data(), static_cast<int>(note->size()), MPI_CHAR, r, kAbortTag, abort_comm, &request) ==
            MPI_SUCCESS)
          MPI_Request_free(&request);
      }
      return;
    }
#endif
    if (boot == Boot::File && !fs::exists(dir / "abort")) write_atomic(dir / "abort", why);
  }

  [[noreturn]] void throw_aborted(const char* op, const std::vector<int>& group) const {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(state_mutex);
      text = reason;
    }
    fail<Error>("{} on devices {}: aborted: {}", op, group, text);
  }

  void destroy_comms() {
    if (is_aborted) return;  // abort_all freed them
    std::vector<std::pair<std::vector<int>, ncclComm_t>> all(groups.begin(), groups.end());
    if (world != nullptr) all.emplace_back(all_ranks(), world);
    if (all.empty()) return;
    DeviceGuard guard(device);
    // Finalize every communicator first (each waits for its peers), then free them.
    bool ok = true;
    for (auto& [group, comm] : all) {
      try {
        {
          std::lock_guard<std::mutex> lock(nccl_mutex);
          const ncclResult_t result = ncclCommFinalize(comm);
          if (result != ncclSuccess && result != ncclInProgress) fail<Error>("ncclCommFinalize failed");
        }
        wait_comm_ready(comm, "ncclCommFinalize", group);
      } catch (...) {
        ok = false;
        break;
      }
    }
    if (!ok) {
      abort_all(fmt::format("rank {}: finalizing the NCCL communicators failed", rank), true);
      return;
    }
    std::lock_guard<std::mutex> lock(nccl_mutex);
    for (auto& [group, comm] : all) ncclCommDestroy(comm);
    groups.clear();
    world = nullptr;
  }

  // ---- calls ----

  // Runs `call` (NCCL calls on `comm`) under nccl_mutex, then, outside the lock, turns an
  // error into an abort (peers told) and waits until the communicator is ready again (a
  // non-blocking call may still be setting up connections).
  void run_nccl(ncclComm_t comm, const char* op, const std::vector<int>& group, const char* what,
                const std::function<ncclResult_t()>& call) {
    ncclResult_t result = ncclSuccess;
    std::string last;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex);
      if (is_aborted) throw_aborted(op, group);
      result = call();
      if (result != ncclSuccess && result != ncclInProgress) last = ncclGetLastError(comm);
    }
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string message = fmt::format("rank {}: {} on devices {}: {} failed: {} ({})", rank, op, group, what,
                                              ncclGetErrorString(result), last);
      abort_all(message, true);
      fail<Error>("{}", message);
    }
    wait_comm_ready(comm, op, group);
  }

  // Checks one call's arguments (the MPI communicator's checks); returns the start time.
  double begin(int dev, const std::vector<int>& group, const char* op) {
    const double start = now_seconds();
    if (is_aborted) throw_aborted(op, group);
    if (dev != rank) fail<ValueError>("{}: device {} is not driven by this process (rank {})", op, dev, rank);
    if (group.empty()) fail<ValueError>("{}: empty group (device {})", op, dev);
    std::vector<int> sorted = group;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      fail<ValueError>("{}: group {} lists a device twice", op, group);
    if (sorted.front() < 0 || sorted.back() >= size)
      fail<ValueError>("{}: group {} names a device outside 0..{} (world of {})", op, group, size - 1, size);
    if (std::find(group.begin(), group.end(), rank) == group.end())
      fail<ValueError>("{}: device {} is not a member of group {}", op, rank, group);
    return start;
  }

  void finish(double start, CommKind kind, size_t n, double full_bytes) {
    const double seconds = now_seconds() - start;
    std::lock_guard<std::mutex> lock(state_mutex);
    record_call(stats, kind, static_cast<int>(n), full_bytes, seconds);
  }

  size_t index_of(const std::vector<int>& group) const {
    return static_cast<size_t>(std::find(group.begin(), group.end(), rank) - group.begin());
  }

  // The communicator of a group of two or more (ranks in group order), created on first use.
  ncclComm_t comm_for(const std::vector<int>& group) {
    if (static_cast<int>(group.size()) == size && std::is_sorted(group.begin(), group.end())) return world;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex);
      auto it = groups.find(group);
      if (it != groups.end()) return it->second;
    }
    const ncclUniqueId id = exchange_id(group, false);
    ncclComm_t comm =
        init_comm(id, group, static_cast<int>(index_of(group)), "ncclCommInitRankConfig (group communicator)");
    std::lock_guard<std::mutex> lock(nccl_mutex);
    if (is_aborted) {
      ncclCommAbort(comm);
      throw_aborted("creating a group communicator", group);
    }
    groups.emplace(group, comm);
    return comm;
  }

  void check_device_pointer(const void* p, const char* what, const char* op) const {
    if (p == nullptr) fail<ValueError>("{}: {} is null", op, what);
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail<ValueError>("{}: {} ({}) is not a CUDA pointer: {}", op, what, p, cudaGetErrorString(status));
    }
    if (attributes.type == cudaMemoryTypeManaged) return;
    if (attributes.type != cudaMemoryTypeDevice)
      fail<ValueError>("{}: {} ({}) is {} memory, not device memory on GPU {}", op, what, p,
                       attributes.type == cudaMemoryTypeHost ? "pinned host" : "unregistered host", device);
    if (attributes.device != device)
      fail<ValueError>("{}: {} ({}) is on GPU {}, but this rank drives GPU {}", op, what, p, attributes.device, device);
  }

  // Whether a group's collective goes through NCCL: groups of two or more, and the world
  // of one (so a single-GPU machine runs NCCL too); other groups of one are device copies.
  bool uses_nccl(const std::vector<int>& group) const { return group.size() > 1 || size == 1; }

  // The enqueueing bodies (arguments checked by the caller). Each leaves the
  // communicator ready for the next call.
  void enqueue_all_gather(const std::vector<int>& group, const void* send, void* recv, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return;
    if (!uses_nccl(group)) {
      if (send != recv) TESSERA_CUDA_CHECK(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, s));
      return;
    }
    ncclComm_t comm = comm_for(group);
    run_nccl(comm, "all_gather", group, "ncclAllGather",
             [&] { return ncclAllGather(send, recv, bytes, ncclUint8, comm, s); });
  }

  void enqueue_all_reduce(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                          cudaStream_t s) {
    const ncclDataType_t type = nccl_sum_type(dtype, "all_reduce");
    if (count == 0) return;
    if (!uses_nccl(group)) {
      if (send != recv)
        TESSERA_CUDA_CHECK(cudaMemcpyAsync(recv, send, count * itemsize(dtype), cudaMemcpyDeviceToDevice, s));
      return;
    }
    ncclComm_t comm = comm_for(group);
    run_nccl(comm, "all_reduce", group, "ncclAllReduce",
             [&] { return ncclAllReduce(send, recv, count, type, ncclSum, comm, s); });
  }

  // recv (count elements) = sum over members of their block `index` of send (n blocks).
  void enqueue_reduce_scatter(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                              cudaStream_t s) {
    const ncclDataType_t type = nccl_sum_type(dtype, "reduce_scatter");
    if (count == 0) return;
    if (!uses_nccl(group)) {
      if (send != recv)
        TESSERA_CUDA_CHECK(cudaMemcpyAsync(recv, send, count * itemsize(dtype), cudaMemcpyDeviceToDevice, s));
      return;
    }
    ncclComm_t comm = comm_for(group);
    // ncclReduceScatter's count is the per-member (received) count.
    run_nccl(comm, "reduce_scatter", group, "ncclReduceScatter",
             [&] { return ncclReduceScatter(send, recv, count, type, ncclSum, comm, s); });
  }

  void enqueue_all_to_all(const std::vector<int>& group, const void* send, void* recv, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return;
    const size_t n = group.size(), me = index_of(group);
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    // Our own block: a device copy (send and recv never overlap here).
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(out + me * bytes, in + me * bytes, bytes, cudaMemcpyDeviceToDevice, s));
    if (n == 1) return;
    ncclComm_t comm = comm_for(group);
    run_nccl(comm, "all_to_all", group, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd", [&] {
      ncclResult_t result = ncclGroupStart();
      if (result != ncclSuccess) return result;
      for (size_t j = 0; j < n && (result == ncclSuccess || result == ncclInProgress); ++j) {
        if (j == me) continue;
        const int peer = static_cast<int>(j);  // comm rank == position in the group
        result = ncclSend(in + j * bytes, bytes, ncclUint8, peer, comm, s);
        if (result == ncclSuccess || result == ncclInProgress)
          result = ncclRecv(out + j * bytes, bytes, ncclUint8, peer, comm, s);
      }
      const ncclResult_t end = ncclGroupEnd();  // always close the group
      return result != ncclSuccess && result != ncclInProgress ? result : end;
    });
  }

  void enqueue_broadcast(const std::vector<int>& group, void* buffer, size_t bytes, cudaStream_t s) {
    if (bytes == 0 || !uses_nccl(group)) return;
    ncclComm_t comm = comm_for(group);
    // Root 0: the group's first member.
    run_nccl(comm, "broadcast", group, "ncclBroadcast",
             [&] { return ncclBroadcast(buffer, buffer, bytes, ncclUint8, 0, comm, s); });
  }

  // ---- host API helpers ----

  // Two device regions of at least `in_bytes` and `out_bytes` (256-byte aligned).
  std::pair<char*, char*> stage(size_t in_bytes, size_t out_bytes) {
    const auto round = [](size_t b) { return (std::max<size_t>(b, 1) + 255) / 256 * 256; };
    const size_t need = round(in_bytes) + round(out_bytes);
    if (need > staging_bytes) {
      if (staging != nullptr) {
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // idle already: host calls wait before returning
        TESSERA_CUDA_CHECK(cudaFree(staging));
        staging = nullptr;
        staging_bytes = 0;
      }
      void* p = nullptr;
      TESSERA_CUDA_CHECK(cudaMalloc(&p, need));
      staging = static_cast<char*>(p);
      staging_bytes = need;
    }
    return {staging, staging + round(in_bytes)};
  }

  void to_device(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  }
  void to_host(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  }
  ncclComm_t comm_or_null(const std::vector<int>& group) { return group.size() > 1 ? comm_for(group) : nullptr; }

  // recv (count elements) = ordered sum over members of their block `index` of send (n
  // blocks of count): an all-to-all on the GPUs, then the sum on the host in group order.
  void scatter_sum(const std::vector<int>& group, const void* send, void* recv, size_t count, DType dtype,
                   const char* op) {
    const size_t n = group.size(), block = count * itemsize(dtype);
    if (n == 1) {
      if (send != recv) std::memmove(recv, send, block);
      return;
    }
    auto [in, out] = stage(n * block, n * block);
    to_device(in, send, n * block);
    enqueue_all_to_all(group, in, out, block, stream);
    std::vector<char> blocks(n * block);
    to_host(blocks.data(), out, n * block);
    wait_stream(stream, comm_or_null(group), op, group);
    std::vector<const char*> srcs(n);
    for (size_t j = 0; j < n; ++j) srcs[j] = blocks.data() + j * block;
    ordered_sum(recv, srcs, count, dtype);
  }
};

// ---- NcclCommunicator ----

NcclCommunicator::NcclCommunicator(const NcclOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->init(options);
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::world_size() const { return impl_->size; }
std::vector<int> NcclCommunicator::local_devices() const { return {impl_->rank}; }
int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::cuda_device() const { return impl_->device; }
cudaStream_t NcclCommunicator::stream() const { return impl_->stream; }
bool NcclCommunicator::aborted() const { return impl_->is_aborted; }
std::string NcclCommunicator::bootstrap() const {
  switch (impl_->boot) {
    case Boot::Mpi:
      return "mpi";
    case Boot::File:
      return "file";
    default:
      return "none";
  }
}

void NcclCommunicator::all_gather(int device, const std::vector<int>& group, const void* send, void* recv,
                                  size_t bytes) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "all_gather");
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, bytes);
  } else {
    auto [in, out] = m.stage(bytes, n * bytes);
    m.to_device(in, send, bytes);
    m.enqueue_all_gather(group, in, out, bytes, m.stream);
    m.to_host(recv, out, n * bytes);
    m.wait_stream(m.stream, m.comm_or_null(group), "all_gather", group);
  }
  m.finish(start, CommKind::AllGather, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::all_reduce(int device, const std::vector<int>& group, const void* send, void* recv, size_t count,
                                  DType dtype) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "all_reduce");
  nccl_sum_type(dtype, "all_reduce");  // the same dtypes as add_into
  DeviceGuard guard(m.device);
  const size_t n = group.size(), item = itemsize(dtype);
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, count * item);
  } else if (count > 0) {
    // As the MPI communicator: pad to n equal chunks, ordered reduce-scatter, all-gather.
    const size_t chunk = (count + n - 1) / n;
    std::vector<char> padded(n * chunk * item, 0);
    std::memcpy(padded.data(), send, count * item);
    std::vector<char> mine(chunk * item);
    m.scatter_sum(group, padded.data(), mine.data(), chunk, dtype, "all_reduce");
    auto [in, out] = m.stage(chunk * item, n * chunk * item);
    m.to_device(in, mine.data(), chunk * item);
    m.enqueue_all_gather(group, in, out, chunk * item, m.stream);
    m.to_host(padded.data(), out, n * chunk * item);
    m.wait_stream(m.stream, m.comm_or_null(group), "all_reduce", group);
    std::memcpy(recv, padded.data(), count * item);
  }
  m.finish(start, CommKind::AllReduce, n, static_cast<double>(count * item));
}

void NcclCommunicator::reduce_scatter(int device, const std::vector<int>& group, const void* send, void* recv,
                                      size_t count, DType dtype) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "reduce_scatter");
  nccl_sum_type(dtype, "reduce_scatter");
  DeviceGuard guard(m.device);
  const size_t n = group.size(), block = count * itemsize(dtype);
  if (count > 0) m.scatter_sum(group, send, recv, count, dtype, "reduce_scatter");
  m.finish(start, CommKind::ReduceScatter, n, static_cast<double>(n * block));
}

void NcclCommunicator::all_to_all(int device, const std::vector<int>& group, const void* send, void* recv,
                                  size_t bytes) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "all_to_all");
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, bytes);
  } else if (bytes > 0) {
    auto [in, out] = m.stage(n * bytes, n * bytes);
    m.to_device(in, send, n * bytes);
    m.enqueue_all_to_all(group, in, out, bytes, m.stream);
    m.to_host(recv, out, n * bytes);
    m.wait_stream(m.stream, m.comm_or_null(group), "all_to_all", group);
  }
  m.finish(start, CommKind::AllToAll, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::broadcast(int device, const std::vector<int>& group, void* buffer, size_t bytes) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "broadcast");
  DeviceGuard guard(m.device);
  if (group.size() > 1 && bytes > 0) {
    auto [in, out] = m.stage(bytes, 0);
    (void)out;
    m.to_device(in, buffer, bytes);
    m.enqueue_broadcast(group, in, bytes, m.stream);
    m.to_host(buffer, in, bytes);
    m.wait_stream(m.stream, m.comm_or_null(group), "broadcast", group);
  }
  m.finish(start, CommKind::Other, group.size(), 0);
}

void NcclCommunicator::barrier(int device, const std::vector<int>& group) {
  Impl& m = *impl_;
  const double start = m.begin(device, group, "barrier");
  DeviceGuard guard(m.device);
  if (group.size() > 1) {
    // A one-element all-reduce that every member must reach, waited for.
    auto [in, out] = m.stage(sizeof(int32_t), 0);
    (void)out;
    TESSERA_CUDA_CHECK(cudaMemsetAsync(in, 0, sizeof(int32_t), m.stream));
    m.enqueue_all_reduce(group, in, in, 1, DType::Int32, m.stream);
    m.wait_stream(m.stream, m.comm_or_null(group), "barrier", group);
  }
  m.finish(start, CommKind::Other, group.size(), 0);
}

void NcclCommunicator::abort(const std::string& reason) {
  impl_->abort_all(fmt::format("rank {}: {}", impl_->rank, reason), true);
}

CommStats NcclCommunicator::stats(int device) const {
  if (device != impl_->rank)
    fail<ValueError>("communicator stats: device {} belongs to rank {}; this is rank {}", device, device, impl_->rank);
  std::lock_guard<std::mutex> lock(impl_->state_mutex);
  return impl_->stats;
}

void NcclCommunicator::reset_stats() {
  std::lock_guard<std::mutex> lock(impl_->state_mutex);
  impl_->stats = {};
}

// ---- device buffers ----

void NcclCommunicator::all_gather_device(const std::vector<int>& group, const void* send, void* recv, size_t bytes,
                                         cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "all_gather_device";
  const double start = m.begin(m.rank, group, op);
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (bytes > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    const bool in_place = send == static_cast<const char*>(recv) + m.index_of(group) * bytes;
    if (!in_place && overlaps(send, bytes, recv, n * bytes))
      fail<ValueError>("{}: send and recv overlap (only send == recv + {} * bytes is allowed)", op, m.index_of(group));
    m.enqueue_all_gather(group, send, recv, bytes, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::AllGather, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::all_reduce_device(const std::vector<int>& group, const void* send, void* recv, size_t count,
                                         DType dtype, cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "all_reduce_device";
  const double start = m.begin(m.rank, group, op);
  nccl_sum_type(dtype, op);
  DeviceGuard guard(m.device);
  const size_t bytes = count * itemsize(dtype);
  if (count > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    if (send != recv && overlaps(send, bytes, recv, bytes))
      fail<ValueError>("{}: send and recv overlap (only send == recv is allowed)", op);
    m.enqueue_all_reduce(group, send, recv, count, dtype, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::AllReduce, group.size(), static_cast<double>(bytes));
}

void NcclCommunicator::reduce_scatter_device(const std::vector<int>& group, const void* send, void* recv, size_t count,
                                             DType dtype, cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "reduce_scatter_device";
  const double start = m.begin(m.rank, group, op);
  nccl_sum_type(dtype, op);
  DeviceGuard guard(m.device);
  const size_t n = group.size(), block = count * itemsize(dtype);
  if (count > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    const bool in_place = recv == static_cast<const char*>(send) + m.index_of(group) * block;
    if (!in_place && overlaps(send, n * block, recv, block))
      fail<ValueError>("{}: send and recv overlap (only recv == send + {} * count * itemsize is allowed)", op,
                       m.index_of(group));
    m.enqueue_reduce_scatter(group, send, recv, count, dtype, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::ReduceScatter, n, static_cast<double>(n * block));
}

void NcclCommunicator::all_to_all_device(const std::vector<int>& group, const void* send, void* recv, size_t bytes,
                                         cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "all_to_all_device";
  const double start = m.begin(m.rank, group, op);
  DeviceGuard guard(m.device);
  const size_t n = group.size();
  if (bytes > 0) {
    m.check_device_pointer(send, "send", op);
    m.check_device_pointer(recv, "recv", op);
    if (overlaps(send, n * bytes, recv, n * bytes))
      fail<ValueError>("{}: send and recv overlap (an all-to-all cannot run in place)", op);
    m.enqueue_all_to_all(group, send, recv, bytes, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::AllToAll, n, static_cast<double>(n * bytes));
}

void NcclCommunicator::broadcast_device(const std::vector<int>& group, void* buffer, size_t bytes,
                                        cudaStream_t stream) {
  Impl& m = *impl_;
  const char* op = "broadcast_device";
  const double start = m.begin(m.rank, group, op);
  DeviceGuard guard(m.device);
  if (bytes > 0) {
    m.check_device_pointer(buffer, "buffer", op);
    m.enqueue_broadcast(group, buffer, bytes, stream != nullptr ? stream : m.stream);
  }
  m.finish(start, CommKind::Other, group.size(), 0);
}

void NcclCommunicator::synchronize(cudaStream_t stream) {
  Impl& m = *impl_;
  const std::vector<int> everyone = m.all_ranks();
  if (m.is_aborted) m.throw_aborted("synchronize", everyone);
  DeviceGuard guard(m.device);
  // NCCL's asynchronous errors show up on the world communicator, and on a group's own.
  std::vector<ncclComm_t> comms;
  {
    std::lock_guard<std::mutex> lock(m.nccl_mutex);
    for (auto& [group, comm] : m.groups) comms.push_back(comm);
  }
  cudaStream_t s = stream != nullptr ? stream : m.stream;
  m.wait_until(
      [&] {
        if (m.world != nullptr && !m.comm_ready(m.world, "synchronize", everyone)) return false;
        for (ncclComm_t comm : comms)
          if (!m.comm_ready(comm, "synchronize", everyone)) return false;
        const cudaError_t status = cudaStreamQuery(s);
        if (status == cudaSuccess) return true;
        if (status == cudaErrorNotReady) return false;
        (void)cudaGetLastError();
        m.abort_all(fmt::format("rank {}: CUDA error while synchronizing: {} ({})", m.rank, cudaGetErrorName(status),
                                cudaGetErrorString(status)),
                    true);
        return false;
      },
      "synchronize", everyone, m.timeout);
}

// ---- sub-groups ----

void NcclCommunicator::split(const std::vector<std::vector<int>>& group_list) {
  Impl& m = *impl_;
  const std::vector<int> everyone = m.all_ranks();
  if (m.is_aborted) m.throw_aborted("split", everyone);
  std::set<int> seen;
  int color = NCCL_SPLIT_NOCOLOR, key = 0;
  std::vector<int> mine;
  for (size_t g = 0; g < group_list.size(); ++g) {
    const std::vector<int>& group = group_list[g];
    if (group.empty()) fail<ValueError>("split: group {} is empty", g);
    for (size_t j = 0; j < group.size(); ++j) {
      const int d = group[j];
      if (d < 0 || d >= m.size) fail<ValueError>("split: group {} names device {} outside 0..{}", group, d, m.size - 1);
      if (!seen.insert(d).second) fail<ValueError>("split: device {} is in more than one group", d);
      if (d == m.rank) {
        mine = group;
        key = static_cast<int>(j);
      }
    }
  }
  bool needed = !mine.empty() && mine.size() > 1 &&
                !(static_cast<int>(mine.size()) == m.size && std::is_sorted(mine.begin(), mine.end()));
  if (needed) {
    std::lock_guard<std::mutex> lock(m.nccl_mutex);
    needed = m.groups.find(mine) == m.groups.end();
  }
  if (needed) {
    // The color: the group's smallest device (the same on every member, distinct per group).
    color = *std::min_element(mine.begin(), mine.end());
  }
  if (m.size == 1) return;
  DeviceGuard guard(m.device);
  ncclComm_t child = nullptr;
  // Collective over the world; the world communicator is ready again once every rank took part.
  m.run_nccl(m.world, "split", everyone, "ncclCommSplit", [&] {
    ncclConfig_t cfg = Impl::config();
    return ncclCommSplit(m.world, color, key, &child, &cfg);
  });
  if (child == nullptr) return;  // not in a new group
  try {
    m.wait_comm_ready(child, "split", mine);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m.nccl_mutex);
    ncclCommAbort(child);  // not stored yet: abort_all did not abort it
    throw;
  }
  std::lock_guard<std::mutex> lock(m.nccl_mutex);
  if (m.is_aborted) {
    ncclCommAbort(child);
    m.throw_aborted("split", mine);
  }
  m.groups.emplace(mine, child);
}

void NcclCommunicator::split(const Mesh& mesh, const std::vector<int>& axes) {
  if (mesh.size() > impl_->size)
    fail<ValueError>("split: mesh {} needs {} devices but the NCCL world has {}", mesh.to_string(), mesh.size(),
                     impl_->size);
  std::set<std::vector<int>> unique;
  for (int d = 0; d < mesh.size(); ++d) unique.insert(mesh.group(d, axes));
  split(std::vector<std::vector<int>>(unique.begin(), unique.end()));
}

}  // namespace tessera::dist
