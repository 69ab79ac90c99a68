#include "tessera/base/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "tessera/base/error.h"

namespace tessera::flags {
namespace {

constexpr std::string_view kLaunch = "tessera launch";

// Sorted by name (a test checks it).
constexpr Flag kFlags[] = {
    {"TESSERA_ATTEMPT", "", "The attempt number (0 first) of the worker group this process belongs to.", kLaunch},
    {"TESSERA_ATTENTION_KERNEL", "auto",
     "Which flash-attention kernels the GPU runs (bf16/f16, no mask): auto (cuDNN's fused attention where "
     "cuDNN loaded and applies, else v2), cudnn (the same, but an error when cuDNN is not loaded), v2 "
     "(tessera's, cp.async pipelined, ldmatrix; head_dim 64 or 128) or v1 (the first ones, kept for "
     "comparison). Read on every launch.",
     ""},
    {"TESSERA_BUFFER_CACHE_MB", "4096",
     "Upper bound, in MiB, of the host buffers the caching allocator keeps for reuse.", ""},
    {"TESSERA_CALIBRATION_CACHE", "~/.cache/tessera/calibration.json",
     "Where the CPU peak for MFU is cached per machine, thread count and build, so a restart does not measure it "
     "again (a leading ~/ is the home directory); empty: measure every run.",
     ""},
    {"TESSERA_COMPILATION_CACHE_DEBUG", "0",
     "1: note on stderr each program the persistent compilation cache cannot store (not serializable).", ""},
    {"TESSERA_COMPILATION_CACHE_DIR", "RUN_DIR/compilation_cache (tessera train); none for programs",
     "The persistent compilation cache's directory (a leading ~/ is the home directory); empty turns it off.", ""},
    {"TESSERA_COMPILATION_CACHE_INDEX", "1",
     "0: jit does not use the cache's per-call index (every call is traced again; entries still load).", ""},
    {"TESSERA_COMPILATION_CACHE_MAX_MB", "2048",
     "Size bound, in MiB, of the persistent compilation cache; the least recently used entries go first.", ""},
    {"TESSERA_COORDINATOR", "",
     "host:port of rank 0 in a TCP job (tessera launch --coordinator): set, the ranks form a TCP communicator "
     "(one process per device) with TESSERA_RANK and TESSERA_WORLD_SIZE.",
     kLaunch},
    {"TESSERA_CPU_BF16_GEMM", "auto",
     "bfloat16 GEMMs on the CPU: auto (the AMX tile kernel where the CPU has AMX-BF16; else the AVX512-BF16 "
     "kernel where it has AVX512-BF16, e.g. Zen 4; else float32 sgemm on widened operands), float32 (always "
     "widen), amx or avx512bf16 (that kernel, float32 where this CPU lacks it): for A/B timing and tests. "
     "bfloat16 attention's tile GEMMs follow it: on AVX512-BF16 when the GEMMs run on bf16 units, widened "
     "to float32 otherwise.",
     ""},
    {"TESSERA_CPU_DEVICES", "1", "The number of virtual CPU devices of an in-process mesh (1 to 4096).", ""},
    {"TESSERA_CPU_INT8_GEMM", "auto",
     "int8 (AQT) GEMMs on the CPU: auto (AMX-INT8 tiles where the CPU has them; else AVX512-VNNI where it has "
     "that, e.g. Zen 4, Ice Lake; else the int8 values multiplied exactly in float64), reference (always "
     "float64), amx or avx512vnni (that kernel, float64 where this CPU lacks it): the same bits on every kernel, "
     "for A/B timing and tests.",
     ""},
    {"TESSERA_CUDA_GRAPHS", "1", "0: GPU programs launch their kernels one by one instead of replaying a CUDA graph.",
     ""},
    {"TESSERA_CUDA_REDUCE", "column",
     "GPU reduction plans: column (sums over leading axes of wide rows, e.g. bias gradients, by a block per strip "
     "of columns and chunk of rows with 16-byte loads; few long rows in about 512 chunks) or legacy (a thread per "
     "column; long rows in chunks of 16384; for A/B timing).",
     ""},
    {"TESSERA_CUDNN_LIBRARY", "libcudnn.so.9",
     "The cuDNN library the GPU backend opens (dlopen) for TESSERA_ATTENTION_KERNEL=cudnn: a file name "
     "searched on the library path, or a path.",
     ""},
    {"TESSERA_DISABLE_PASSES", "",
     "Compiler passes to skip, by name (e.g. fusion,cse: bisecting a miscompile); part of compilation-cache keys.", ""},
    {"TESSERA_DUMP", "", "A directory: the compiler writes the program after every pass there (IR text).", ""},
    {"TESSERA_EVAL_CACHE_MB", "256", "Bytes, in MiB, of arenas eager eval() keeps in its cache of compiled graphs.",
     ""},
    {"TESSERA_FAULT", "",
     "Fault injection for resilience tests: a ';'-separated list such as kill@step=5;kill@save=2;corrupt_newest.", ""},
    {"TESSERA_GEMM_AUTOTUNE", "0",
     "1: time each cuBLASLt algorithm on first use and keep the fastest (not "
     "deterministic across runs).",
     ""},
    {"TESSERA_GEMM_RESTAGE", "1", "0: do not zero-pad misaligned 16-bit GEMM dimensions for the tensor cores.", ""},
    {"TESSERA_GEMM_TF32", "0", "1: allow TF32 tensor cores for float32 GEMMs on the GPU.", ""},
    {"TESSERA_GOODPUT_ATTEMPT", "",
     "The attempt the supervisor opened in the run's goodput log; the worker records into it.", kLaunch},
    {"TESSERA_GOODPUT_DIR", "run.dir",
     "The run directory whose goodput/ a worker records into (the launcher's --run-dir): the job log on rank 0, "
     "events.rank-R.jsonl on every rank.",
     kLaunch},
    {"TESSERA_GPU_VIRTUAL_DEVICES", "",
     "N: the CUDA backend shows N devices, all on GPU 0, each with its own stream, handles and allocator, so an "
     "N-device mesh runs on one GPU (collectives as device copies ordered by events; the SPMD correctness mode).",
     ""},
    {"TESSERA_HEARTBEAT_FILE", "",
     "The file a worker rewrites with its step as it trains ({rank} is replaced by the rank); the supervisor's "
     "hang detector reads it.",
     kLaunch},
    {"TESSERA_LOCAL_RANK", "", "This worker's rank on its host.", kLaunch},
    {"TESSERA_LOCAL_TIER_ROOT", "/dev/shm:$TMPDIR (else /tmp)",
     "Where checkpoint.local_dir = \"auto\" may put a run's local checkpoint tier: ':'-separated parent "
     "directories, tried in order (the tests point it into their build tree).",
     ""},
    {"TESSERA_LOCAL_WORLD_SIZE", "", "The workers on this host (their thread pools share its CPUs).", kLaunch},
    {"TESSERA_NCCL_BOOTSTRAP", "mpi under mpirun, else file", "How NCCL ranks exchange their unique id: mpi or file.",
     ""},
    {"TESSERA_NCCL_BOOTSTRAP_DIR", "", "The shared directory of the file bootstrap.", ""},
    {"TESSERA_NCCL_BOOTSTRAP_TIMEOUT_S", "300", "Seconds a rank waits for the others' ids in the file bootstrap.", ""},
    {"TESSERA_NCCL_RANK", "", "This process's NCCL rank (else RANK, else OMPI_COMM_WORLD_RANK).", ""},
    {"TESSERA_NCCL_TIMEOUT_S", "600",
     "Seconds after which an unfinished collective aborts the NCCL communicator (0: wait forever).", ""},
    {"TESSERA_NCCL_WORLD_SIZE", "", "The number of NCCL ranks (else WORLD_SIZE, else OMPI_COMM_WORLD_SIZE).", ""},
    {"TESSERA_NODE_RANK", "", "This worker's host (node) in a TCP job (tessera launch --node-rank).", kLaunch},
    {"TESSERA_NUM_THREADS", "the number of cores", "Threads of the process-wide pool (the caller included).", ""},
    {"TESSERA_POOL_SPIN_US", "50",
     "Microseconds a pool thread polls for the next parallel region (or the region's end) before it sleeps; 0: "
     "sleep at once (many processes sharing few cores).",
     ""},
    {"TESSERA_PROFILE", "0",
     "1: time every kernel of compiled programs (profile tables by op); 2: also a row per kernel, shape by shape.", ""},
    {"TESSERA_RANK", "", "This worker's rank in the job.", kLaunch},
    {"TESSERA_RENDEZVOUS_TIMEOUT_S", "300",
     "Seconds the ranks of a TCP job wait for each other at start-up (pods start in any order).", ""},
    {"TESSERA_TCP_TIMEOUT_S", "1800",
     "Seconds a collective of a TCP job waits for its peers before it aborts the job (0: wait forever).", ""},
    {"TESSERA_WORLD_SIZE", "", "The number of workers in the job.", kLaunch},
};

}  // namespace

std::span<const Flag> all() { return kFlags; }

const Flag* find(std::string_view name) {
  for (const Flag& f : kFlags)
    if (f.name == name) return &f;
  return nullptr;
}

const char* env(const char* name) {
  const std::string_view n(name);
  if (n.starts_with("TESSERA_") && find(n) == nullptr)
    fail<Error>("environment variable {} is read but not declared in src/base/flags.cpp", n);
  return std::getenv(name);
}

int64_t env_integer(const char* name, int64_t fallback, int64_t min, int64_t max, const char* what) {
  const char* value = env(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value, &end, 10);
  if (*end != '\0' || errno == ERANGE || n < min || n > max)
    fail<ValueError>("{}='{}' is not {} (expected an integer from {} to {})", name, value, what, min, max);
  return n;
}

std::optional<int64_t> first_env_integer(std::initializer_list<const char*> names, int64_t min, int64_t max) {
  for (const char* name : names) {
    const char* value = env(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(value, &end, 10);
    if (*end == '\0' && errno != ERANGE && n >= min && n <= max) return n;
  }
  return std::nullopt;
}

std::string table(bool with_values) {
  std::string out =
      with_values ? "| variable | default | set by | what it does | value here |\n| --- | --- | --- | --- | --- |\n"
                  : "| variable | default | set by | what it does |\n| --- | --- | --- | --- |\n";
  for (const Flag& f : kFlags) {
    out += fmt::format("| `{}` | {} | {} | {} |", f.name, f.default_value.empty() ? "(unset)" : f.default_value,
                       f.set_by.empty() ? "you" : f.set_by, f.doc);
    if (with_values) {
      const char* v = std::getenv(std::string(f.name).c_str());
      out += fmt::format(" {} |", v == nullptr ? "(unset)" : fmt::format("`{}`", v));
    }
    out += '\n';
  }
  return out;
}

}  // namespace tessera::flags
