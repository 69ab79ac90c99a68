// The supervisor loop of `tessera launch` (see supervisor.h).
#include "launch/supervisor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <thread>

#include "launch/scheduler_queue.h"
#include "launch/worker_group.h"
#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/json_field.h"
#include "tessera/goodput/recorder.h"

namespace fs = std::filesystem;

namespace tessera::launch {
namespace {

std::atomic<int> g_launcher_signal{0};
extern "C" void on_launcher_signal(int signal) { g_launcher_signal.store(signal); }

// SIGINT/SIGTERM to the launcher are passed on to the workers (see supervise).
class LauncherSignalScope {
 public:
  LauncherSignalScope() {
    g_launcher_signal.store(0);
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~LauncherSignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  LauncherSignalScope(const LauncherSignalScope&) = delete;
  LauncherSignalScope& operator=(const LauncherSignalScope&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

double monotonic_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sleeps `seconds`, waking early when the launcher gets a signal.
void interruptible_sleep(double seconds) {
  const double end = monotonic_now() + seconds;
  while (g_launcher_signal.load() == 0) {
    const double left = end - monotonic_now();
    if (left <= 0) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.05)));
  }
}

fs::path heartbeat_file(const fs::path& dir, int rank) { return dir / fmt::format("rank-{}.json", rank); }

// The heartbeat of a rank (train/heartbeat.h), or nullopt while there is none (or it
// cannot be parsed: the writer renames whole files, so that means a foreign file; it is
// ignored). A beat without a phase is a step beat.
struct Beat {
  Progress progress;
  int64_t pid = 0;
  std::string host;  // the worker's host name ("" from a worker that does not say)
};
std::optional<Beat> read_heartbeat(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const std::optional<int64_t> step = json_field<int64_t>(j, "step");
  if (!step) return std::nullopt;
  Beat beat;
  beat.progress.step = *step;
  beat.progress.phase = json_field_or<std::string>(j, "phase", "step");
  beat.progress.worker_time = json_field_or<double>(j, "time", 0.0);
  beat.progress.expect_s = json_field<double>(j, "expect_s");
  beat.pid = json_field_or<int64_t>(j, "pid", 0);
  beat.host = json_field_or<std::string>(j, "host", "");
  return beat;
}

fs::path stacks_marker(const fs::path& heartbeat) { return fs::path(heartbeat.string() + ".stacks"); }

// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, ...), or '?'.
char process_state(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string text;
  std::getline(in, text);
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : '?';
}

std::string this_host() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string();
}

// Asks the stuck rank for every thread's stack before it is killed, then waits up to
// `wait_s` for the marker the trainer touches when done. A rank on this host gets
// SIGUSR1 at the pid its heartbeat names; a rank on another host (whose pid means
// nothing here) gets a request file beside its heartbeat (train/stack_request.h).
std::string request_stacks(const std::optional<Beat>& beat, const fs::path& heartbeat, double wait_s) {
  if (!beat || beat->pid <= 0) return "no pid in its heartbeat to ask for stacks";
  const auto pid = static_cast<pid_t>(beat->pid);
  const bool remote = !beat->host.empty() && beat->host != this_host();
  const std::string who = remote ? fmt::format("pid {} on {}", pid, beat->host) : fmt::format("pid {}", pid);
  std::error_code ec;
  fs::remove(stacks_marker(heartbeat), ec);
  if (remote) {
    try {
      fileio::write_file_atomic(heartbeat.string() + ".stacks-request", "", fileio::Durability::Atomic);
    } catch (const IOError& e) {
      return fmt::format("{}: cannot request stacks: {}", who, e.what());
    }
  } else {
    if (process_state(pid) == 'T') return fmt::format("{} is stopped (SIGSTOP): it cannot write stacks", who);
    if (::kill(pid, SIGUSR1) != 0) return fmt::format("{} cannot be signalled for stacks", who);
  }
  const double end = monotonic_now() + wait_s;
  while (monotonic_now() < end) {
    if (fs::exists(stacks_marker(heartbeat), ec)) return fmt::format("{} wrote its threads' stacks to its log", who);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return fmt::format("{} wrote no stacks within {:.0f} s (stopped, or not a tessera trainer)", who, wait_s);
}

std::string step_text(int64_t step) { return step < 0 ? "before its first step" : fmt::format("at step {}", step); }

// mpirun's arguments for several hosts: the host list with its slots, the remote agent,
// and -x for every variable the ranks need (a remote rank sees only what -x exports):
// the launcher's own and every TESSERA_* of this environment (TESSERA_FAULT, ...).
void append_host_arguments(const LaunchOptions& o, WorkerSpec& spec) {
  std::string hosts;
  for (const std::string& host : o.hosts)
    hosts += fmt::format("{}{}:{}", hosts.empty() ? "" : ",", host, o.nproc_per_host);
  spec.argv.insert(spec.argv.end(), {"--host", hosts});
  if (!o.launch_agent.empty()) spec.argv.insert(spec.argv.end(), {"--mca", "plm_rsh_agent", o.launch_agent});
  std::vector<std::string> names;
  for (const auto& [name, value] : spec.env) names.push_back(name);
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (!text.starts_with("TESSERA_")) continue;
    std::string name(text.substr(0, text.find('=')));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  for (const std::string& name : names) spec.argv.insert(spec.argv.end(), {"-x", name});
}

// A fork-mode worker's rank in the job: its host's first rank plus its index here.
int global_rank(const LaunchOptions& o, int local) { return o.node_rank * o.nproc + local; }

std::vector<WorkerSpec> worker_specs(const LaunchOptions& o, const fs::path& beats, int attempt, int log_attempt) {
  const std::vector<std::pair<std::string, std::string>> common = {
      {"TESSERA_WORLD_SIZE", std::to_string(o.nproc * o.nnodes)},
      {"TESSERA_ATTEMPT", std::to_string(attempt)},
      {"TESSERA_GOODPUT_ATTEMPT", std::to_string(log_attempt)},
      // Every rank records into the launcher's run directory, even a task that trains in
      // a directory of its own, so the job's log and the per-rank logs sit together.
      {"TESSERA_GOODPUT_DIR", fs::absolute(o.run_dir).string()},
  };
  std::vector<WorkerSpec> specs;
  if (o.mode == LaunchMode::kFork) {
    for (int rank = 0; rank < o.nproc; ++rank) {
      WorkerSpec spec{o.command, common};
      spec.env.emplace_back("TESSERA_RANK", std::to_string(global_rank(o, rank)));
      spec.env.emplace_back("TESSERA_LOCAL_RANK", std::to_string(rank));
      spec.env.emplace_back("TESSERA_LOCAL_WORLD_SIZE", std::to_string(o.nproc));
      spec.env.emplace_back("TESSERA_HEARTBEAT_FILE", heartbeat_file(beats, rank).string());
      if (!o.coordinator.empty()) {
        spec.env.emplace_back("TESSERA_COORDINATOR", o.coordinator);
        spec.env.emplace_back("TESSERA_NODE_RANK", std::to_string(o.node_rank));
      }
      specs.push_back(std::move(spec));
    }
    return specs;
  }
  // One launcher process for all ranks; each rank fills in "{rank}" (train/heartbeat.h).
  WorkerSpec spec{{}, common};
  spec.env.emplace_back("TESSERA_HEARTBEAT_FILE", (beats / "rank-{rank}.json").string());
  if (o.mode == LaunchMode::kMpirun) {
    spec.argv = {"mpirun", "-n", std::to_string(o.nproc)};
    if (!o.hosts.empty()) append_host_arguments(o, spec);
  } else
    spec.argv = {"srun", fmt::format("--ntasks={}", o.nproc), "--kill-on-bad-exit=1"};
  spec.argv.insert(spec.argv.end(), o.command.begin(), o.command.end());
  specs.push_back(std::move(spec));
  return specs;
}

// A host list mpirun can use: distinct names this machine resolves, the rank count they make.
void check_hosts(const LaunchOptions& o) {
  if (o.mode != LaunchMode::kMpirun) fail<ValueError>("launch: --hosts starts the ranks with mpirun (mode mpirun)");
  if (o.nproc_per_host < 1) fail<ValueError>("launch: --nproc-per-host {}; expected at least 1", o.nproc_per_host);
  if (o.nproc != static_cast<int>(o.hosts.size()) * o.nproc_per_host)
    fail<ValueError>("launch: {} ranks, but {} host(s) with {} per host make {}", o.nproc, o.hosts.size(),
                     o.nproc_per_host, o.hosts.size() * o.nproc_per_host);
  for (size_t i = 0; i < o.hosts.size(); ++i) {
    const std::string& host = o.hosts[i];
    if (host.empty() || host.find_first_of(" \t,:") != std::string::npos)
      fail<ValueError>("launch: --hosts entry {} '{}' is not a host name", i + 1, host);
    if (std::find(o.hosts.begin(), o.hosts.begin() + static_cast<std::ptrdiff_t>(i), host) !=
        o.hosts.begin() + static_cast<std::ptrdiff_t>(i))
      fail<ValueError>("launch: host '{}' appears twice in --hosts (use --nproc-per-host for more ranks)", host);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    addrinfo* found = nullptr;
    if (const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0)
      fail<ValueError>("launch: unknown host '{}' in --hosts (entry {}): {}", host, i + 1, ::gai_strerror(error));
    ::freeaddrinfo(found);
  }
}

void check_options(const LaunchOptions& o) {
  if (o.command.empty()) fail<ValueError>("launch: no command to run (give it after --)");
  if (o.run_dir.empty()) fail<ValueError>("launch: no run directory for the goodput log (--run-dir DIR)");
  if (o.nproc < 1) fail<ValueError>("launch: --nproc {}; expected at least 1", o.nproc);
  if (o.max_restarts < 0) fail<ValueError>("launch: --max-restarts {}; expected 0 or more", o.max_restarts);
  if (!(o.backoff_s >= 0)) fail<ValueError>("launch: --backoff {} s; expected 0 or more", o.backoff_s);
  if (!(o.stack_dump_wait_s >= 0))
    fail<ValueError>("launch: stack dump wait {} s; expected 0 or more", o.stack_dump_wait_s);
  if (!(o.grace_s >= 0)) fail<ValueError>("launch: --grace {} s; expected 0 or more", o.grace_s);
  if (!(o.poll_s > 0)) fail<ValueError>("launch: poll interval {} s; expected a positive number", o.poll_s);
  if (o.mode == LaunchMode::kSrun && std::getenv("SLURM_JOB_ID") == nullptr)
    fail<ValueError>("launch: --srun needs a Slurm allocation (SLURM_JOB_ID is not set); use salloc/sbatch");
  if (!o.hosts.empty()) check_hosts(o);
  if (o.coordinator.empty() && (o.nnodes != 1 || o.node_rank != 0))
    fail<ValueError>("launch: --nnodes and --node-rank need --coordinator HOST:PORT (where rank 0 listens)");
  if (!o.coordinator.empty()) {
    if (o.mode != LaunchMode::kFork)
      fail<ValueError>("launch: --coordinator starts the ranks itself (a TCP job); it excludes --mpi, --srun, --hosts");
    if (o.nnodes < 1) fail<ValueError>("launch: --nnodes {}; expected at least 1", o.nnodes);
    if (o.node_rank < 0 || o.node_rank >= o.nnodes)
      fail<ValueError>("launch: --node-rank {} is outside 0..{} (--nnodes {})", o.node_rank, o.nnodes - 1, o.nnodes);
  }
}

}  // namespace

LaunchResult supervise(const LaunchOptions& options) {
  check_options(options);
  const auto print =
      options.print ? options.print : [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  const bool own_beats = options.heartbeat_dir.empty();
  fs::path beats = options.heartbeat_dir;
  if (own_beats) {
    // Ranks on other hosts (--hosts, srun) write into the run directory (shared
    // storage), not this host's /tmp.
    const bool other_hosts = !options.hosts.empty() || options.mode == LaunchMode::kSrun;
    if (other_hosts) fs::create_directories(options.run_dir);
    const fs::path parent = other_hosts ? fs::absolute(options.run_dir) : fs::temp_directory_path();
    std::string pattern = (parent / "tessera-launch-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) fail<IOError>("launch: cannot create a heartbeat directory {}", pattern);
    beats = pattern;
  } else {
    fs::create_directories(beats);
  }
  struct RemoveDir {
    fs::path dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } remove_beats{own_beats ? beats : fs::path()};

  // One job log, written by node 0; another host's launcher logs its own attempts
  // beside it (its workers still record into the job's directory).
  goodput::Recorder recorder(options.node_rank == 0
                                 ? fs::path(options.run_dir)
                                 : fs::path(options.run_dir) / "nodes" / fmt::format("node-{}", options.node_rank));
  std::string command_text;
  for (const std::string& arg : options.command) command_text += (command_text.empty() ? "" : " ") + arg;
  recorder.job_start("tessera launch: " + command_text);
  if (std::getenv("SLURM_JOB_ID") != nullptr) {  // the queue wait, as the scheduler saw it
    std::string why_not;
    if (const std::optional<QueueWait> wait = slurm_queue_wait(&why_not)) {
      recorder.launch_wait(wait->submitted, wait->started, wait->source + ": queued");
      print(fmt::format("launch: {} waited {:.1f} s in the queue (submit to start); recorded as scheduling wait",
                        wait->source, wait->started - wait->submitted));
    } else {
      print("launch: no queue wait recorded: " + why_not);
    }
  }

  LauncherSignalScope signals;
  HangDetector detector(options.nproc, options.hang);
  LaunchResult result;
  std::string previous_reason;
  int failures_without_progress = 0;  // consecutive attempts that failed before any step
  for (int attempt = 0;; ++attempt) {
    if (const int signal = g_launcher_signal.load(); signal != 0) {  // during the backoff
      print(fmt::format("launch: stopped by {} before attempt {}", signal_name(signal), attempt));
      result.exit_code = 128 + signal;
      return result;
    }
    for (int rank = 0; rank < options.nproc; ++rank) fs::remove(heartbeat_file(beats, rank));
    recorder.attempt_start(previous_reason);
    WorkerGroup group;
    const double started = monotonic_now();
    try {
      group.start(worker_specs(options, beats, attempt, recorder.attempt()));
    } catch (const IOError& e) {
      print(fmt::format("launch: attempt {} could not start: {}", attempt, e.what()));
      recorder.failure(0, kExitCannotExecute, e.what());
      recorder.job_end(false);
      result.attempts.push_back({attempt, e.what(), kExitCannotExecute, 0, 0, 0});
      result.exit_code = kExitCannotExecute;
      return result;
    }
    std::string started_what = options.mode == LaunchMode::kFork ? fmt::format("{} worker(s)", options.nproc)
                                                                 : fmt::format("{} ranks", options.nproc);
    if (!options.coordinator.empty())
      started_what = fmt::format("ranks {}..{} of {} (host {} of {}, coordinator {})", global_rank(options, 0),
                                 global_rank(options, options.nproc - 1), options.nproc * options.nnodes,
                                 options.node_rank, options.nnodes, options.coordinator);
    if (!options.hosts.empty())
      started_what += fmt::format(" on {} hosts ({})", options.hosts.size(), fmt::join(options.hosts, ", "));
    print(fmt::format("launch: attempt {} started {} ({} of at most {})", attempt, started_what, attempt + 1,
                      options.max_restarts + 1));
    detector.start_attempt(started);

    AttemptOutcome outcome{attempt, "ok", 0, 0, 0, 0};
    bool failed = false;
    bool hung = false;
    while (true) {
      if (const int signal = g_launcher_signal.load(); signal != 0) {
        // Stopped from outside (preemption, Ctrl-C): the workers get the same signal and
        // the grace period to checkpoint; the scheduler decides what comes next.
        const std::string reason = fmt::format("launcher stopped by {}", signal_name(signal));
        print("launch: " + reason + "; passing it on to the workers");
        recorder.failure(signal, 0, reason);
        group.signal_all(signal);
        group.terminate(options.grace_s);
        result.attempts.push_back({attempt, reason, 0, signal, monotonic_now() - started, 0});
        result.exit_code = 128 + signal;
        return result;
      }
      for (const WorkerExit& e : group.poll()) {
        if (e.ok()) {
          if (options.mode == LaunchMode::kFork) detector.finished(e.rank);
          continue;
        }
        if (failed) continue;
        failed = true;
        outcome.exit_code = e.exit_code;
        outcome.signal = e.signal;
        const std::string who = options.mode == LaunchMode::kFork ? fmt::format("rank {}", global_rank(options, e.rank))
                                : options.mode == LaunchMode::kMpirun ? std::string("mpirun")
                                                                      : std::string("srun");
        const int64_t step = options.mode == LaunchMode::kFork ? detector.last_step(e.rank) : detector.last_step(0);
        outcome.reason = e.signal != 0 ? fmt::format("{} killed by {} {}", who, signal_name(e.signal), step_text(step))
                                       : fmt::format("{} exit {} {}", who, e.exit_code, step_text(step));
      }
      if (failed || !group.running()) break;
      const double now = monotonic_now();
      for (int rank = 0; rank < options.nproc; ++rank)
        if (const std::optional<Beat> beat = read_heartbeat(heartbeat_file(beats, rank)))
          detector.observe(rank, beat->progress, now);
      if (std::optional<std::string> hang = detector.check(now)) {
        failed = true;
        hung = true;
        outcome.reason = *hang;
        const int rank = std::max(detector.hung_rank(now), 0);
        const fs::path file = heartbeat_file(beats, rank);
        print(fmt::format("launch: {}; rank {}: {}", *hang, rank,
                          request_stacks(read_heartbeat(file), file, options.stack_dump_wait_s)));
        break;
      }
      interruptible_sleep(options.poll_s);
    }
    outcome.seconds = monotonic_now() - started;

    if (!failed) {
      print(fmt::format("launch: attempt {} succeeded after {:.1f} s", attempt, outcome.seconds));
      recorder.job_end(true);
      result.attempts.push_back(outcome);
      result.exit_code = kExitOk;
      break;
    }
    // The failure is recorded before the others are stopped, so it is the attempt's
    // first failure in the log (a stopped trainer records "stopped by SIGTERM" after it).
    recorder.failure(outcome.signal, outcome.exit_code, outcome.reason);
    // After a hang no grace: the hung rank cannot checkpoint, and the others wait on it
    // in a collective (a stopped process would not even see SIGTERM).
    group.terminate(hung ? 0 : options.grace_s);
    const bool no_retry = outcome.signal == 0 && outcome.exit_code == kExitNoRetry;
    const bool exhausted = attempt >= options.max_restarts;
    if (no_retry || exhausted) {
      print(fmt::format("launch: attempt {} failed after {:.1f} s: {}; {}", attempt, outcome.seconds, outcome.reason,
                        no_retry ? "exit 2 is a usage/config error: not retrying"
                                 : fmt::format("no restarts left (--max-restarts {})", options.max_restarts)));
      recorder.job_end(false);
      result.attempts.push_back(outcome);
      result.exit_code = no_retry ? kExitNoRetry : kExitBudgetExhausted;
      break;
    }
    // After progress the next attempt starts at once; only a crash loop backs off.
    if (detector.made_progress()) {
      failures_without_progress = 0;
      outcome.backoff_s = 0;
    } else {
      ++failures_without_progress;
      outcome.backoff_s = std::min(options.backoff_s * std::pow(2.0, failures_without_progress - 1),
                                   std::max(options.backoff_s, 300.0));
    }
    print(fmt::format("launch: attempt {} failed after {:.1f} s: {}; restarting in {:.1f} s ({}; {} restart(s) left)",
                      attempt, outcome.seconds, outcome.reason, outcome.backoff_s,
                      failures_without_progress == 0
                          ? "it made progress"
                          : fmt::format("{} failure(s) in a row before any step", failures_without_progress),
                      options.max_restarts - attempt));
    result.attempts.push_back(outcome);
    previous_reason = outcome.reason;
    if (outcome.backoff_s > 0) {
      const double wait_start = unix_now();
      interruptible_sleep(outcome.backoff_s);
      recorder.launch_wait(wait_start, unix_now(), "tessera launch: restart backoff");
    }
  }
  const int restarts = static_cast<int>(result.attempts.size()) - 1;
  print(fmt::format("launch: {} after {} attempt(s) ({} restart(s)); exit {}",
                    result.exit_code == kExitOk ? "succeeded" : "gave up", result.attempts.size(), restarts,
                    result.exit_code));
  return result;
}

}  // namespace tessera::launch
