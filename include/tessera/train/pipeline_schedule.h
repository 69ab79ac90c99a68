// Pipeline-parallel schedules: which forward and backward pass of which micro-batch
// each pipeline device runs, in what order, and what that costs in idle time (the
// bubble) and in activations held.
//
// A model of L layers is cut into S = p * v contiguous stages (p devices on the
// pipeline axis, v virtual stages each: device d holds stages d, d + p, ...,
// d + (v-1) p, Megatron's interleaving). Each of m micro-batches goes forward through
// stages 0 .. S-1 and backward through S-1 .. 0:
//   F(mb, s) needs F(mb, s-1);  B(mb, s) needs F(mb, s) and B(mb, s+1).
// A schedule is each device's order of its F and B ops:
//   gpipe        all forwards, then all backwards (every micro-batch's activations
//                are held at once: m per device)
//   1f1b         PipeDream-flush: p-d-1 warm-up forwards on device d, then one forward
//                and one backward alternately, then the remaining backwards (at most
//                p-d micro-batches in flight: memory bounded by the depth, not m)
//   interleaved  1F1B over v virtual stages per device (Megatron-LM's order; m a
//                multiple of p): the warm-up and drain shrink by v
// With a forward costing t_f and a backward t_b on every stage, the idle share of the
// devices' time is (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v m + p-1) interleaved
// (Narayanan et al., SC'21, section 2.2). simulate() replays a schedule with those
// costs and measures it; the tests hold the two to each other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::train {

enum class PipelineKind { kGPipe, kOneFOneB, kInterleaved };

// "gpipe", "1f1b", "interleaved"; ConfigError listing them for anything else.
PipelineKind parse_pipeline_kind(const std::string& name);
std::string to_string(PipelineKind kind);

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  int stage = 0;  // 0 .. stages-1 (device = stage % devices)
};

struct PipelineSchedule {
  PipelineKind kind = PipelineKind::kOneFOneB;
  int devices = 1;         // p
  int virtual_stages = 1;  // v (1 unless interleaved)
  int micro_batches = 1;   // m
  int stages() const { return devices * virtual_stages; }
  // ops[d]: device d's ops in the order it runs them (2 * m * v each).
  std::vector<std::vector<PipelineOp>> ops;
};

// The schedule of `kind` for p devices, m micro-batches and v virtual stages per device
// (v must be 1 unless interleaved; interleaved needs v >= 2 and m a multiple of p).
// ValueErrors say which number is wrong and what it must be.
PipelineSchedule make_pipeline_schedule(PipelineKind kind, int devices, int micro_batches, int virtual_stages = 1);

// The idle fraction theory gives for a schedule with uniform stage costs.
double analytic_bubble_fraction(const PipelineSchedule& schedule);

// A replay of the schedule: every device runs its ops in order, each as soon as the
// device is free and its inputs exist (sends take `transfer` time units).
struct PipelineTimeline {
  struct Slot {
    PipelineOp op;
    double start = 0, end = 0;
  };
  std::vector<std::vector<Slot>> devices;  // per device, in run order
  double makespan = 0;
  double busy = 0;  // sum of op durations over devices
  // Measured timelines: the CPU time the device threads got during their ops (equal to
  // busy when every thread had a core to itself; less when they waited for one).
  double cpu_busy = 0;
  double bubble_fraction = 0;       // 1 - busy / (devices * makespan)
  std::vector<int> peak_in_flight;  // per device: most micro-batch stages whose forward ran and backward did not
};

// Replays `schedule` with a forward costing `forward_cost`, a backward `backward_cost`
// and a hop between devices `transfer`. A schedule whose order can never finish (an op
// that waits on one ordered after it) is a ValueError naming each stuck device's op.
PipelineTimeline simulate(const PipelineSchedule& schedule, double forward_cost = 1, double backward_cost = 2,
                          double transfer = 0);
// The same with each stage's own forward and backward cost (schedule.stages() of each).
PipelineTimeline simulate(const PipelineSchedule& schedule, const std::vector<double>& forward_costs,
                          const std::vector<double>& backward_costs, double transfer = 0);

// One line per device: the timeline in units of `unit` time ("F3" forward of
// micro-batch 3, "B3" its backward, "." idle; interleaved ops carry the virtual stage,
// "F3:1"), then the bubble fraction, measured and analytic.
std::string render_timeline(const PipelineTimeline& timeline, const PipelineSchedule& schedule, double unit = 1);

// Contiguous split of layers (their costs, in order) into `stages` stages minimizing
// the most expensive stage (ties: earlier stages lighter). Returns each stage's first
// layer and one past its last. Fewer layers than stages is a ValueError.
std::vector<std::pair<int, int>> balance_stages(const std::vector<double>& layer_costs, int stages);

}  // namespace tessera::train
