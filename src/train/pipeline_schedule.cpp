// Pipeline schedules, their replay and the stage balance (see pipeline_schedule.h).
#include "tessera/train/pipeline_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "tessera/base/error.h"

namespace tessera::train {
namespace {

PipelineOp forward(int micro_batch, int stage) { return {true, micro_batch, stage}; }
PipelineOp backward(int micro_batch, int stage) { return {false, micro_batch, stage}; }

std::string op_text(const PipelineOp& op, bool interleaved, int devices) {
  std::string text = fmt::format("{}{}", op.forward ? 'F' : 'B', op.micro_batch);
  if (interleaved) text += fmt::format(":{}", op.stage / devices);
  return text;
}

// Device d's 1F1B order given its forwards and backwards in their own orders and the
// number of warm-up forwards: warm-up, then forward/backward pairs, then the drain.
std::vector<PipelineOp> one_f_one_b(const std::vector<PipelineOp>& forwards, const std::vector<PipelineOp>& backwards,
                                    size_t warmup) {
  std::vector<PipelineOp> order(forwards.begin(), forwards.begin() + static_cast<std::ptrdiff_t>(warmup));
  for (size_t i = 0; i + warmup < forwards.size(); ++i) {
    order.push_back(forwards[warmup + i]);
    order.push_back(backwards[i]);
  }
  for (size_t i = forwards.size() - warmup; i < backwards.size(); ++i) order.push_back(backwards[i]);
  return order;
}

}  // namespace

PipelineKind parse_pipeline_kind(const std::string& name) {
  if (name == "gpipe") return PipelineKind::kGPipe;
  if (name == "1f1b") return PipelineKind::kOneFOneB;
  if (name == "interleaved") return PipelineKind::kInterleaved;
  fail<ConfigError>("pipeline schedule '{}' is unknown (expected one of: gpipe, 1f1b, interleaved)", name);
}

std::string to_string(PipelineKind kind) {
  switch (kind) {
    case PipelineKind::kGPipe:
      return "gpipe";
    case PipelineKind::kOneFOneB:
      return "1f1b";
    case PipelineKind::kInterleaved:
      return "interleaved";
  }
  return "?";
}

PipelineSchedule make_pipeline_schedule(PipelineKind kind, int devices, int micro_batches, int virtual_stages) {
  if (devices < 1) fail<ValueError>("pipeline: {} devices; expected at least 1", devices);
  if (micro_batches < 1) fail<ValueError>("pipeline: {} micro-batches; expected at least 1", micro_batches);
  if (kind == PipelineKind::kInterleaved) {
    if (virtual_stages < 2)
      fail<ValueError>("pipeline: the interleaved schedule needs at least 2 virtual stages per device (got {})",
                       virtual_stages);
    if (micro_batches % devices != 0)
      fail<ValueError>(
          "pipeline: the interleaved schedule needs the micro-batch count to be a multiple of the pipeline "
          "devices ({} micro-batches, {} devices)",
          micro_batches, devices);
  } else if (virtual_stages != 1) {
    fail<ValueError>("pipeline: {} virtual stages per device need the interleaved schedule (this is {})",
                     virtual_stages, to_string(kind));
  }
  PipelineSchedule s;
  s.kind = kind;
  s.devices = devices;
  s.virtual_stages = virtual_stages;
  s.micro_batches = micro_batches;
  s.ops.resize(static_cast<size_t>(devices));
  const int p = devices, m = micro_batches, v = virtual_stages;
  for (int d = 0; d < p; ++d) {
    std::vector<PipelineOp> forwards, backwards;
    if (kind != PipelineKind::kInterleaved) {
      for (int mb = 0; mb < m; ++mb) {
        forwards.push_back(forward(mb, d));
        backwards.push_back(backward(mb, d));
      }
    } else {
      // Megatron-LM's order: micro-batches in groups of p; within a group every virtual
      // stage in turn (forwards: 0 .. v-1, backwards: v-1 .. 0).
      for (int k = 0; k < m * v; ++k) {
        const int mb = (k / (p * v)) * p + k % p;
        const int chunk = (k % (p * v)) / p;
        forwards.push_back(forward(mb, chunk * p + d));
        backwards.push_back(backward(mb, (v - 1 - chunk) * p + d));
      }
    }
    size_t warmup = 0;
    switch (kind) {
      case PipelineKind::kGPipe:
        warmup = forwards.size();
        break;
      case PipelineKind::kOneFOneB:
        warmup = static_cast<size_t>(std::min(p - d - 1, m));
        break;
      case PipelineKind::kInterleaved:
        // Two per later device (its forward and the backward coming back), plus the
        // other virtual stages of the first group; all of them when m == p.
        warmup =
            m == p ? forwards.size() : std::min(static_cast<size_t>((p - d - 1) * 2 + (v - 1) * p), forwards.size());
        break;
    }
    s.ops[static_cast<size_t>(d)] = one_f_one_b(forwards, backwards, warmup);
  }
  return s;
}

double analytic_bubble_fraction(const PipelineSchedule& s) {
  const double p = s.devices, m = s.micro_batches, v = s.virtual_stages;
  return (p - 1) / (v * m + p - 1);
}

PipelineTimeline simulate(const PipelineSchedule& s, double forward_cost, double backward_cost, double transfer) {
  const auto stages = static_cast<size_t>(s.stages());
  return simulate(s, std::vector<double>(stages, forward_cost), std::vector<double>(stages, backward_cost), transfer);
}

PipelineTimeline simulate(const PipelineSchedule& s, const std::vector<double>& forward_costs,
                          const std::vector<double>& backward_costs, double transfer) {
  const int p = s.devices, stages = s.stages();
  if (forward_costs.size() != static_cast<size_t>(stages) || backward_costs.size() != static_cast<size_t>(stages))
    fail<ValueError>("simulate: {} forward and {} backward costs for {} stages", forward_costs.size(),
                     backward_costs.size(), stages);
  // When each op ended, once it is placed: (forward?, micro-batch, stage) -> end.
  std::map<std::tuple<bool, int, int>, double> ended;
  auto ready_at = [&](const PipelineOp& op, double* at) {
    double t = 0;
    auto need = [&](bool fwd, int stage, bool cross) {
      const auto it = ended.find({fwd, op.micro_batch, stage});
      if (it == ended.end()) return false;
      t = std::max(t, it->second + (cross ? transfer : 0));
      return true;
    };
    const bool ok = op.forward
                        ? (op.stage == 0 || need(true, op.stage - 1, (op.stage - 1) % p != op.stage % p))
                        : (need(true, op.stage, false) &&
                           (op.stage == stages - 1 || need(false, op.stage + 1, (op.stage + 1) % p != op.stage % p)));
    *at = t;
    return ok;
  };
  PipelineTimeline timeline;
  timeline.devices.resize(static_cast<size_t>(p));
  timeline.peak_in_flight.assign(static_cast<size_t>(p), 0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0);
  std::vector<int> in_flight(static_cast<size_t>(p), 0);
  size_t remaining = 0;
  for (const auto& ops : s.ops) remaining += ops.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int d = 0; d < p; ++d) {
      const auto& ops = s.ops[static_cast<size_t>(d)];
      size_t& i = next[static_cast<size_t>(d)];
      double inputs = 0;
      while (i < ops.size() && ready_at(ops[i], &inputs)) {
        const PipelineOp& op = ops[i];
        const double start = std::max(free_at[static_cast<size_t>(d)], inputs);
        const double end = start + (op.forward ? forward_costs : backward_costs)[static_cast<size_t>(op.stage)];
        ended[{op.forward, op.micro_batch, op.stage}] = end;
        timeline.devices[static_cast<size_t>(d)].push_back({op, start, end});
        free_at[static_cast<size_t>(d)] = end;
        timeline.busy += end - start;
        int& held = in_flight[static_cast<size_t>(d)];
        held += op.forward ? 1 : -1;
        timeline.peak_in_flight[static_cast<size_t>(d)] =
            std::max(timeline.peak_in_flight[static_cast<size_t>(d)], held);
        ++i;
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::vector<std::string> stuck;
      for (int d = 0; d < p; ++d)
        if (const size_t i = next[static_cast<size_t>(d)]; i < s.ops[static_cast<size_t>(d)].size()) {
          const PipelineOp& op = s.ops[static_cast<size_t>(d)][i];
          stuck.push_back(
              fmt::format("device {} waits at {} of stage {} (its op {})", d, op_text(op, false, p), op.stage, i));
        }
      fail<ValueError>(
          "pipeline schedule {} cannot finish: {}; each needs an input that some device's order puts "
          "after an op it waits on",
          to_string(s.kind), fmt::join(stuck, "; "));
    }
  }
  for (double t : free_at) timeline.makespan = std::max(timeline.makespan, t);
  timeline.bubble_fraction = timeline.makespan > 0 ? 1 - timeline.busy / (p * timeline.makespan) : 0;
  return timeline;
}

std::string render_timeline(const PipelineTimeline& t, const PipelineSchedule& s, double unit) {
  if (!(unit > 0)) fail<ValueError>("render_timeline: unit {}; expected a positive time", unit);
  const bool interleaved = s.kind == PipelineKind::kInterleaved;
  const int cells = static_cast<int>(std::ceil(t.makespan / unit - 1e-9));
  size_t width = 2;
  for (const auto& slots : t.devices)
    for (const auto& slot : slots) width = std::max(width, op_text(slot.op, interleaved, s.devices).size());
  std::string out;
  for (size_t d = 0; d < t.devices.size(); ++d) {
    std::vector<std::string> row(static_cast<size_t>(cells), std::string(width, '.'));
    for (const auto& slot : t.devices[d]) {
      const int first = static_cast<int>(std::lround(slot.start / unit));
      const int last = static_cast<int>(std::lround(slot.end / unit));
      for (int c = first; c < last && c < cells; ++c) {
        const std::string text = c == first ? op_text(slot.op, interleaved, s.devices) : std::string(width, '-');
        row[static_cast<size_t>(c)] = text + std::string(width - text.size(), ' ');
      }
    }
    out += fmt::format("device {:>2} |{}|\n", d, fmt::join(row, " "));
  }
  out += fmt::format("{} over {} devices, {} micro-batches{}: bubble {:.1f}% (analytic {:.1f}%), peak in flight {}\n",
                     to_string(s.kind), s.devices, s.micro_batches,
                     interleaved ? fmt::format(", {} virtual stages each", s.virtual_stages) : "",
                     100 * t.bubble_fraction, 100 * analytic_bubble_fraction(s), fmt::join(t.peak_in_flight, "/"));
  return out;
}

std::vector<std::pair<int, int>> balance_stages(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1) fail<ValueError>("pipeline: {} stages; expected at least 1", stages);
  if (n < stages)
    fail<ValueError>("pipeline: {} layers cannot fill {} stages (each stage needs at least one layer)", n, stages);
  for (int i = 0; i < n; ++i)
    if (!(costs[static_cast<size_t>(i)] >= 0))
      fail<ValueError>("pipeline: layer {} has cost {}; expected a cost >= 0", i, costs[static_cast<size_t>(i)]);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest possible heaviest stage when layers 0..i-1 form k stages.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(static_cast<size_t>(stages) + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n - (stages - k); ++i)
      for (int j = k - 1; j < i; ++j) {  // the last stage is layers j..i-1, longest first
        const double heaviest = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (heaviest < best[k][i] * (1 - 1e-12)) {  // strictly better: on a tie the longer last stage stays
          best[k][i] = heaviest;
          cut[k][i] = j;
        }
      }
  std::vector<std::pair<int, int>> out(static_cast<size_t>(stages));
  int end = n;
  for (int k = stages; k >= 1; --k) {
    out[static_cast<size_t>(k) - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return out;
}

}  // namespace tessera::train
