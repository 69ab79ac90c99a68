// `tessera launch [options] -- COMMAND ARGS...`: runs a job under a supervisor that
// restarts it after failures and hangs (src/launch/supervisor.h).
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "launch/supervisor.h"
#include "spmd/tcp/tcp_socket.h"
#include "tessera/base/error.h"
#include "tessera/train/config.h"

namespace tessera::cli {
namespace {

struct LaunchCliOptions {
  launch::LaunchOptions launch;
  std::string hang_timeout = "auto";
  bool mpi = false;
  bool srun = false;
  std::string hosts;  // comma-separated
  CLI::Option* nproc_option = nullptr;
  CLI::Option* nnodes_option = nullptr;
  CLI::Option* node_rank_option = nullptr;
  CLI::Option* per_host_option = nullptr;
  CLI::Option* agent_option = nullptr;
};

// The device count of a `tessera train` command's --mesh (axis=size,...), or 0 when it
// names none or a size is not a number (auto).
int64_t mesh_devices_of(const std::vector<std::string>& command) {
  std::string mesh;
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == "--mesh" && i + 1 < command.size()) mesh = command[i + 1];
    if (command[i].starts_with("--mesh=")) mesh = command[i].substr(7);
  }
  if (mesh.empty()) return 0;
  int64_t devices = 1;
  size_t start = 0;
  while (start <= mesh.size()) {
    const size_t end = std::min(mesh.find(',', start), mesh.size());
    const std::string axis = mesh.substr(start, end - start);
    const size_t equals = axis.find('=');
    if (equals == std::string::npos) return 0;
    const std::string size = axis.substr(equals + 1);
    if (size.empty() || size.find_first_not_of("0123456789") != std::string::npos || size.size() > 9) return 0;
    devices *= std::stoll(size);
    start = end + 1;
  }
  return devices;
}

std::vector<std::string> split_hosts(const std::string& list) {
  std::vector<std::string> hosts;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    hosts.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return hosts;
}

// The run directory of a `tessera train` command: --set run.dir=..., else the config's.
std::string run_dir_of(const std::vector<std::string>& command) {
  std::string config;
  std::vector<std::string> overrides;
  bool is_train = false;
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& arg = command[i];
    if (arg == "train") is_train = true;
    const bool has_value = i + 1 < command.size();
    if ((arg == "--config" || arg == "-c") && has_value)
      config = command[++i];
    else if (arg.starts_with("--config="))
      config = arg.substr(9);
    else if (arg == "--set" && has_value)
      overrides.push_back(command[++i]);
    else if (arg.starts_with("--set="))
      overrides.push_back(arg.substr(6));
  }
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it)
    if (it->starts_with("run.dir=")) {
      std::string dir = it->substr(8);
      if (dir.size() >= 2 && dir.front() == '"' && dir.back() == '"') dir = dir.substr(1, dir.size() - 2);
      return dir;
    }
  if (!is_train || config.empty()) return {};
  return train::load_config(config, overrides).run.dir;
}

// HOST:0 of a one-host TCP job: HOST with a port the kernel calls free now (its
// workers start at once; another job grabbing it in between makes rank 0 wait for it).
std::string with_free_port(const std::string& endpoint) {
  const std::string host = endpoint.substr(0, endpoint.size() - 2);
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_any;
  socklen_t length = sizeof address;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin6_port);
  if (fd >= 0) ::close(fd);
  if (port == 0) {
    const int fd4 = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address4{};
    address4.sin_family = AF_INET;
    socklen_t length4 = sizeof address4;
    if (fd4 >= 0 && ::bind(fd4, reinterpret_cast<sockaddr*>(&address4), length4) == 0 &&
        ::getsockname(fd4, reinterpret_cast<sockaddr*>(&address4), &length4) == 0)
      port = ntohs(address4.sin_port);
    if (fd4 >= 0) ::close(fd4);
  }
  if (port == 0) fail<IOError>("--coordinator {}: no free port found on this host", endpoint);
  return fmt::format("{}:{}", host, port);
}

int run_launch(LaunchCliOptions& options) {
  launch::LaunchOptions& o = options.launch;
  if (options.mpi && options.srun) {
    fmt::print(stderr, "tessera launch: --mpi and --srun exclude each other\n");
    return 2;
  }
  o.mode = options.mpi    ? launch::LaunchMode::kMpirun
           : options.srun ? launch::LaunchMode::kSrun
                          : launch::LaunchMode::kFork;
  if (!options.hosts.empty()) {
    if (options.srun) {
      fmt::print(stderr,
                 "tessera launch: --hosts and --srun exclude each other (inside Slurm, srun places the ranks)\n");
      return 2;
    }
    o.hosts = split_hosts(options.hosts);
    const int64_t ranks = static_cast<int64_t>(o.hosts.size()) * o.nproc_per_host;
    if (options.nproc_option->count() > 0 && o.nproc != ranks) {
      fmt::print(stderr, "tessera launch: --nproc {} disagrees with --hosts {} x --nproc-per-host {} = {} ranks\n",
                 o.nproc, options.hosts, o.nproc_per_host, ranks);
      return 2;
    }
    o.nproc = static_cast<int>(ranks);
    o.mode = launch::LaunchMode::kMpirun;
  } else if (!o.coordinator.empty()) {
    if (options.mpi || options.srun) {
      fmt::print(stderr, "tessera launch: --coordinator starts a TCP job itself; it excludes --mpi and --srun\n");
      return 2;
    }
    try {
      if (o.coordinator.ends_with(":0") && o.nnodes == 1) o.coordinator = with_free_port(o.coordinator);
      spmd::tcp::parse_endpoint(o.coordinator, "--coordinator");
    } catch (const ValueError& e) {
      fmt::print(stderr, "tessera launch: {}\n", e.what());
      return 2;
    }
    if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes) {
      fmt::print(stderr, "tessera launch: --node-rank {} with --nnodes {}: expected 0 <= node rank < nnodes\n",
                 o.node_rank, o.nnodes);
      return 2;
    }
    // --nproc counts the job's ranks, --nproc-per-host this host's (as with --hosts).
    const bool per_host_given = options.per_host_option->count() > 0;
    const bool total_given = options.nproc_option->count() > 0;
    if (total_given && !per_host_given) {
      if (o.nproc % o.nnodes != 0) {
        fmt::print(stderr, "tessera launch: --nproc {} does not divide into --nnodes {} hosts\n", o.nproc, o.nnodes);
        return 2;
      }
      o.nproc_per_host = o.nproc / o.nnodes;
    } else if (total_given && o.nproc != o.nnodes * o.nproc_per_host) {
      fmt::print(stderr, "tessera launch: --nproc {} disagrees with --nnodes {} x --nproc-per-host {} = {} ranks\n",
                 o.nproc, o.nnodes, o.nproc_per_host, o.nnodes * o.nproc_per_host);
      return 2;
    }
    if (o.nproc_per_host < 1) {
      fmt::print(stderr, "tessera launch: --nproc-per-host {}; expected at least 1\n", o.nproc_per_host);
      return 2;
    }
    o.nproc = o.nproc_per_host;  // the workers this launcher starts
  } else if (options.per_host_option->count() > 0 || options.agent_option->count() > 0) {
    fmt::print(stderr, "tessera launch: --nproc-per-host and --launch-agent need --hosts or --coordinator\n");
    return 2;
  }
  if (o.coordinator.empty() && (options.nnodes_option->count() > 0 || options.node_rank_option->count() > 0)) {
    fmt::print(stderr,
               "tessera launch: --nnodes and --node-rank need --coordinator HOST:PORT (where rank 0 listens)\n");
    return 2;
  }
  if (o.mode == launch::LaunchMode::kMpirun || !o.coordinator.empty()) {
    // One device per rank: a --mesh of another size would fail on every rank.
    const int64_t ranks = o.coordinator.empty() ? o.nproc : static_cast<int64_t>(o.nnodes) * o.nproc;
    if (const int64_t devices = mesh_devices_of(o.command); devices != 0 && devices != ranks) {
      fmt::print(stderr,
                 "tessera launch: the command's --mesh has {} devices, but {} starts {} ranks (one device each)\n",
                 devices,
                 !o.coordinator.empty() ? "--nnodes x --nproc-per-host"
                 : o.hosts.empty()      ? "--nproc"
                                        : "--hosts",
                 ranks);
      return 2;
    }
  }
  if (options.hang_timeout != "auto") {
    char* end = nullptr;
    const double seconds = std::strtod(options.hang_timeout.c_str(), &end);
    if (end == options.hang_timeout.c_str() || *end != '\0' || !(seconds > 0)) {
      fmt::print(stderr, "tessera launch: --hang-timeout '{}': expected seconds (> 0) or auto\n", options.hang_timeout);
      return 2;
    }
    o.hang.timeout_s = seconds;
  }
  if (o.command.empty()) {
    fmt::print(stderr, "tessera launch: no command; usage: tessera launch [options] -- COMMAND ARGS...\n");
    return 2;
  }
  // `tessera` as the command means this very binary (it need not be on PATH).
  if (o.command.front() == "tessera") {
    char self[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) o.command.front() = std::string(self, static_cast<size_t>(n));
  }
  if (o.run_dir.empty()) o.run_dir = run_dir_of(o.command);
  if (o.run_dir.empty()) {
    fmt::print(stderr,
               "tessera launch: cannot tell the run directory from the command (it reads --set run.dir= and "
               "--config of `tessera train`); give --run-dir DIR\n");
    return 2;
  }
  try {
    const launch::LaunchResult result = launch::supervise(o);
    return result.exit_code;
  } catch (const ValueError& e) {  // a bad option (an unknown host, ...): a usage error
    fmt::print(stderr, "tessera {}\n", e.what());
    return 2;
  }
}

}  // namespace

Command add_launch_command(CLI::App& app) {
  auto options = std::make_shared<LaunchCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "launch", "Run a job under a supervisor that restarts it after failures and hangs (-- COMMAND ARGS...)");
  sub->footer(
      "Exit status: 0 success; 2 usage error, or a worker exited 2 (a config/usage error: not retried); "
      "75 (EX_TEMPFAIL) the restart budget is spent: requeue the job; 127 the command cannot be run; "
      "128+N the launcher got signal N (passed on to the workers, which checkpoint and stop).\n"
      "Workers get TESSERA_RANK, TESSERA_LOCAL_RANK, TESSERA_WORLD_SIZE, TESSERA_ATTEMPT and "
      "TESSERA_HEARTBEAT_FILE ('tessera train' writes its step there); with --coordinator also TESSERA_COORDINATOR and "
      "TESSERA_NODE_RANK. Attempts, reasons and backoff waits go "
      "to RUN_DIR/goodput/events.jsonl.");
  launch::LaunchOptions& o = options->launch;
  options->nproc_option =
      sub->add_option("--nproc,-n", o.nproc, "Worker processes (ranks); with --hosts, hosts x --nproc-per-host")
          ->capture_default_str();
  sub->add_option("--hosts", options->hosts,
                  "Start the ranks on these hosts (h1,h2,...: the same command on each, through mpirun and its remote "
                  "agent; run.dir on shared storage)");
  options->per_host_option =
      sub->add_option("--nproc-per-host", o.nproc_per_host, "Ranks per host with --hosts or --coordinator")
          ->capture_default_str();
  options->agent_option = sub->add_option(
      "--launch-agent", o.launch_agent,
      "How mpirun reaches the other hosts with --hosts (default: ssh; tools/testbed.sh agent for the test hosts)");
  sub->add_option("--coordinator", o.coordinator,
                  "A TCP job without MPI (Kubernetes pods, hosts started by hand): HOST:PORT where rank 0 (node 0's "
                  "first worker) listens; every host runs this same launch with its --node-rank (one host: HOST:0 "
                  "picks a free port)");
  options->nnodes_option =
      sub->add_option("--nnodes", o.nnodes, "Hosts of a TCP job (with --coordinator)")->capture_default_str();
  options->node_rank_option = sub->add_option(
      "--node-rank", o.node_rank, "This host's index in a TCP job, 0..nnodes-1 (its ranks: node-rank x per-host + i)");
  sub->add_option("--max-restarts", o.max_restarts, "Restarts of the whole job (not per rank)")->capture_default_str();
  sub->add_option("--hang-timeout", options->hang_timeout,
                  "Seconds without step progress that count as a hang, or auto: max(3 s, 5 x the median step "
                  "time), 60 s until a step time is known (eval, save and start-up have their own limits: "
                  "docs/launch.md)")
      ->capture_default_str();
  sub->add_option("--startup-timeout", o.hang.startup_s,
                  "Seconds allowed for start-up, restore and compile (and eval or save without an estimate)")
      ->capture_default_str();
  sub->add_option("--heartbeat-dir", o.heartbeat_dir,
                  "Where workers write heartbeats (default: a temporary directory; shared storage for srun)");
  sub->add_option("--backoff", o.backoff_s,
                  "Seconds before restarting after an attempt that failed before any step, doubling for each "
                  "such attempt in a row (after progress the restart is immediate)")
      ->capture_default_str();
  sub->add_option("--grace", o.grace_s,
                  "Seconds between SIGTERM and SIGKILL when stopping workers after a crash (after a hang: none)")
      ->capture_default_str();
  sub->add_option("--run-dir", o.run_dir,
                  "Run directory for the goodput log (default: the run.dir of a `tessera train` command)");
  sub->add_flag("--mpi", options->mpi, "Start one `mpirun -n N COMMAND` job instead of N processes");
  sub->add_flag("--srun", options->srun, "Inside a Slurm allocation: start `srun --ntasks=N COMMAND`");
  add_verbatim_command(sub, o.command, "The worker command (after --)");
  return Command{sub, [options] { return run_launch(*options); }};
}

}  // namespace tessera::cli
