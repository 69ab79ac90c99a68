// Appends one rank's step records (see rank_log.h): one write() per line, no fsync.
#include "tessera/goodput/rank_log.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/base/flags.h"
#include "tessera/goodput/events.h"

namespace tessera::goodput {
namespace {

double system_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The first of `names` set to a non-negative integer.
std::optional<int> int_from_env(std::initializer_list<const char*> names) {
  const std::optional<int64_t> n = flags::first_env_integer(names, 0, (int64_t{1} << 30) - 1);
  return n ? std::optional<int>(static_cast<int>(*n)) : std::nullopt;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace

RankIdentity rank_from_environment() {
  RankIdentity id;
  id.rank = int_from_env({"TESSERA_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}).value_or(0);
  id.world_size = int_from_env({"TESSERA_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}).value_or(1);
  if (id.world_size <= id.rank) id.world_size = id.rank + 1;
  return id;
}

std::filesystem::path rank_log_path(const std::filesystem::path& run_dir, int rank) {
  return run_dir / "goodput" / fmt::format("events.rank-{}.jsonl", rank);
}

RankRecorder::RankRecorder(const std::filesystem::path& run_dir, RankIdentity identity, int attempt,
                           std::function<double()> clock)
    : path_(rank_log_path(run_dir, identity.rank)),
      identity_(identity),
      attempt_(attempt),
      clock_(clock ? std::move(clock) : system_now) {
  std::error_code ec;
  std::filesystem::create_directories(path_.parent_path(), ec);
  if (ec) fail<IOError>("goodput: cannot create {}: {}", path_.parent_path().string(), ec.message());
  file_ = std::make_unique<fileio::File>(path_, O_RDWR | O_CREAT | O_APPEND);
  // A previous process of this rank may have died mid-line: start on a line of our own.
  bool torn = false;
  if (const uint64_t size = file_->size(); size > 0) {
    char last = '\n';
    torn = file_->read_at(size - 1, &last, 1) == 1 && last != '\n';
  }
  const nlohmann::json start = {{"v", kSchemaVersion},
                                {"t", clock_()},
                                {"type", event_type_name(EventType::kRankStart)},
                                {"rank", identity_.rank},
                                {"world_size", identity_.world_size},
                                {"attempt", attempt_},
                                {"pid", static_cast<int64_t>(::getpid())},
                                {"host", host_name()}};
  write_line((torn ? "\n" : "") + start.dump());
}

RankRecorder::~RankRecorder() = default;

void RankRecorder::step(int64_t step, double start, double end, double data_wait_s, double collective_s) {
  const nlohmann::json line = {{"v", kSchemaVersion},
                               {"t", clock_()},
                               {"type", event_type_name(EventType::kRankStep)},
                               {"rank", identity_.rank},
                               {"attempt", attempt_},
                               {"step", step},
                               {"start", start},
                               {"end", end},
                               {"data_wait_s", data_wait_s},
                               {"collective_s", collective_s}};
  write_line(line.dump());
}

void RankRecorder::write_line(const std::string& line) {
  // One write() of the whole line: O_APPEND keeps it contiguous, so a crash can only cut
  // its end, never interleave it with another line.
  const std::string data = line + "\n";
  file_->write_all(data.data(), data.size());
}

}  // namespace tessera::goodput
