// Appends goodput events, one line per write(), fsynced at phase boundaries.
#include "tessera/goodput/recorder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/base/json_field.h"

namespace tessera::goodput {
namespace {

double system_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* part_name(SavePart part) { return part == SavePart::kBlocking ? "blocking" : "background"; }

}  // namespace

Recorder::Recorder(const std::filesystem::path& run_dir, RecorderOptions options)
    : path_(event_log_path(run_dir)), options_(std::move(options)) {
  if (!options_.clock) options_.clock = system_now;
  std::error_code ec;
  std::filesystem::create_directories(path_.parent_path(), ec);
  if (ec) fail<IOError>("goodput: cannot create {}: {}", path_.parent_path().string(), ec.message());

  bool needs_newline = false;
  if (std::filesystem::exists(path_, ec)) {
    std::ifstream in(path_, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const std::string content = text.str();
    needs_newline = !content.empty() && content.back() != '\n';  // a torn last line from a crash
    const EventLog log = parse_event_log(content, path_.string());
    for (const Event& event : log.events) {
      if (event.type == EventType::kJobStart) has_job_start_ = true;
      if (event.type == EventType::kAttemptStart) last_attempt_in_log_ = std::max(last_attempt_in_log_, event.attempt);
      if (event.type == EventType::kFailure) last_failure_ = event.text("message", "failure");
    }
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail<IOError>("goodput: cannot open {} for appending: {}", path_.string(), std::strerror(errno));
  if (needs_newline) write_line("", true);  // the next event starts on its own line
}

Recorder::~Recorder() {
  if (fd_ >= 0) ::close(fd_);
}

int Recorder::attempt() const {
  std::lock_guard lock(mutex_);
  return attempt_;
}

double Recorder::now() const { return options_.clock(); }

void Recorder::write_line(const std::string& line, bool sync) {
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail<IOError>("goodput: cannot write to {}: {}", path_.string(), std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  if (sync && options_.fsync && ::fsync(fd_) != 0)
    fail<IOError>("goodput: fsync of {} failed: {}", path_.string(), std::strerror(errno));
}

void Recorder::record(EventType type, nlohmann::json fields, bool sync) {
  std::lock_guard lock(mutex_);
  nlohmann::json event = nlohmann::json::object();
  event["v"] = kSchemaVersion;
  event["t"] = options_.clock();
  event["type"] = event_type_name(type);
  if (type == EventType::kAttemptStart) {
    attempt_ = std::max(attempt_, last_attempt_in_log_) + 1;
    last_attempt_in_log_ = attempt_;
  }
  if (attempt_ >= 0) event["attempt"] = attempt_;
  for (auto& [key, value] : fields.items()) event[key] = value;
  if (type == EventType::kFailure) last_failure_ = json_field_or<std::string>(event, "message", "failure");
  write_line(event.dump(), sync);
}

void Recorder::job_start(std::string_view job_name) {
  {
    std::lock_guard lock(mutex_);
    if (has_job_start_) return;
    has_job_start_ = true;
  }
  record(EventType::kJobStart, {{"job", job_name}, {"pid", static_cast<int64_t>(::getpid())}});
}

void Recorder::attempt_start(std::string_view reason) {
  std::string why(reason);
  {
    std::lock_guard lock(mutex_);
    // Under `tessera launch` the supervisor has already written this attempt's
    // attempt_start (with the reason) and names its number here: join it.
    if (const char* joined = flags::env("TESSERA_GOODPUT_ATTEMPT"); joined != nullptr && attempt_ < 0 &&
                                                                    last_attempt_in_log_ >= 0 &&
                                                                    std::to_string(last_attempt_in_log_) == joined) {
      attempt_ = last_attempt_in_log_;
      return;
    }
    if (why.empty() && last_attempt_in_log_ >= 0)
      why = last_failure_.empty() ? "no failure recorded (killed?)" : last_failure_;
  }
  record(EventType::kAttemptStart, {{"reason", why}});
}

void Recorder::backend_init_start() { record(EventType::kBackendInitStart); }
void Recorder::backend_init_end(std::string_view backend) {
  record(EventType::kBackendInitEnd, {{"backend", backend}});
}
void Recorder::compile_start(std::string_view what) { record(EventType::kCompileStart, {{"what", what}}); }
void Recorder::compile_end(bool cache_hit) { record(EventType::kCompileEnd, {{"cache_hit", cache_hit}}); }
void Recorder::checkpoint_restore_start(int64_t step) { record(EventType::kCheckpointRestoreStart, {{"step", step}}); }
void Recorder::checkpoint_restore_end(int64_t step) { record(EventType::kCheckpointRestoreEnd, {{"step", step}}); }
void Recorder::checkpoint_save_start(int64_t step, SavePart part) {
  record(EventType::kCheckpointSaveStart, {{"step", step}, {"part", part_name(part)}});
}
void Recorder::checkpoint_save_end(int64_t step, SavePart part, bool committed) {
  record(EventType::kCheckpointSaveEnd, {{"step", step}, {"part", part_name(part)}, {"committed", committed}});
}
void Recorder::data_wait_start() { record(EventType::kDataWaitStart, {}, false); }
void Recorder::data_wait_end() { record(EventType::kDataWaitEnd, {}, false); }
void Recorder::step_start(int64_t step) { record(EventType::kStepStart, {{"step", step}}, false); }
void Recorder::step_end(int64_t step, int64_t tokens, double model_flops, double pipeline_bubble) {
  nlohmann::json fields = {{"step", step}, {"tokens", tokens}, {"model_flops", model_flops}};
  if (pipeline_bubble >= 0) fields["pipeline_bubble"] = pipeline_bubble;
  record(EventType::kStepEnd, fields, false);
}
void Recorder::eval_start() { record(EventType::kEvalStart); }
void Recorder::eval_end() { record(EventType::kEvalEnd); }
void Recorder::failure(int signal, int exit_code, std::string_view message) {
  record(EventType::kFailure, {{"signal", signal}, {"exit_code", exit_code}, {"message", message}});
}
void Recorder::custom_badput_start(std::string_view type) {
  record(EventType::kCustomBadputStart, {{"badput_type", type}});
}
void Recorder::custom_badput_end(std::string_view type) {
  record(EventType::kCustomBadputEnd, {{"badput_type", type}});
}
void Recorder::job_end(bool ok) { record(EventType::kJobEnd, {{"status", ok ? "ok" : "failed"}}); }
void Recorder::calibration(const Calibration& c) {
  record(
      EventType::kCalibration,
      {{"peak_flops", c.peak_flops}, {"n", c.n}, {"repeats", c.repeats}, {"seconds", c.seconds}, {"method", c.method}});
}
void Recorder::device(const DeviceRecord& d) {
  record(
      EventType::kDevice,
      {{"name", d.name}, {"count", d.count}, {"peak_flops_per_device", d.peak_flops_per_device}, {"source", d.source}});
}
void Recorder::launch_wait(double start, double end, std::string_view launcher) {
  if (!(end >= start)) fail<ValueError>("goodput: launch_wait end {} is before start {}", end, start);
  record(EventType::kLaunchWait, {{"start", start}, {"end", end}, {"launcher", launcher}});
}

Span::Span(Recorder& recorder, Phase phase, std::string custom_type, int64_t step)
    : recorder_(recorder), phase_(phase), custom_type_(std::move(custom_type)), step_(step) {
  switch (phase_) {
    case Phase::kBackendInit:
      recorder_.backend_init_start();
      break;
    case Phase::kCompile:
      recorder_.compile_start();
      break;
    case Phase::kCheckpointRestore:
      recorder_.checkpoint_restore_start(step_);
      break;
    case Phase::kDataWait:
      recorder_.data_wait_start();
      break;
    case Phase::kEval:
      recorder_.eval_start();
      break;
    case Phase::kCustomBadput:
      recorder_.custom_badput_start(custom_type_);
      break;
  }
}

Span::~Span() {
  // A destructor must not throw; a failed write here is reported, and the reader will
  // close the open phase at the end of the attempt.
  try {
    switch (phase_) {
      case Phase::kBackendInit:
        recorder_.backend_init_end();
        break;
      case Phase::kCompile:
        recorder_.compile_end(cache_hit_);
        break;
      case Phase::kCheckpointRestore:
        recorder_.checkpoint_restore_end(step_);
        break;
      case Phase::kDataWait:
        recorder_.data_wait_end();
        break;
      case Phase::kEval:
        recorder_.eval_end();
        break;
      case Phase::kCustomBadput:
        recorder_.custom_badput_end(custom_type_);
        break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "goodput: could not record the end of a phase: %s\n", e.what());
  }
}

}  // namespace tessera::goodput
