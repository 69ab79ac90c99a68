// The time a job waited in its scheduler's queue before `tessera launch` started, as the
// scheduler itself reports it, so the goodput log's Scheduling Goodput is measured rather
// than assumed (goodput/calculator.h: launch_wait records are the scheduling wait).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tessera::launch {

struct QueueWait {
  double submitted = 0;  // Unix seconds: the job entered the queue
  double started = 0;    // Unix seconds: the scheduler started it
  std::string source;    // "slurm job 4242", for the log
};

// Under Slurm (SLURM_JOB_ID set): SubmitTime and StartTime of `scontrol show job -o ID`.
// nullopt with the reason in *why_not when not under Slurm, scontrol is missing or fails,
// or the times are not there or out of order.
std::optional<QueueWait> slurm_queue_wait(std::string* why_not);

// One line of `scontrol show job -o` (Key=Value words; times YYYY-MM-DDTHH:MM:SS in the
// local time zone, as slurmctld prints them).
std::optional<QueueWait> parse_scontrol_job(std::string_view line, std::string* why_not);

}  // namespace tessera::launch
