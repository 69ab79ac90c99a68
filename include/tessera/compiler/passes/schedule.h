// Memory-aware scheduling: moves every node as late as it can go, to just before
// its first user, so a value computed early but read late no longer stays live
// across the nodes in between. Nodes that produce graph outputs or have no users
// keep their relative order; the others follow the order their results are first
// needed in (ties: original order). Deterministic, and never moves a node before
// one of its inputs. Then a node whose outputs are smaller than the inputs it is the
// last to read (a weight gradient, a reduction) moves up to just after their other
// readers, when that lowers the live bytes (schedule.cpp; hoist_shrinking), and casts
// of the program's inputs (bf16 copies of float32 weights) move to the front where no
// position then holds more than the peak, so that a backend can launch them together.
#pragma once

#include <string>

#include "tessera/compiler/pass.h"

namespace tessera::compiler {

class SchedulePass : public Pass {
 public:
  explicit SchedulePass(bool hoist_shrinking = true) : hoist_shrinking_(hoist_shrinking) {}
  std::string name() const override { return "schedule"; }
  void run(Graph& graph) override;

  // The hoisting sweeps the last run made (each visits every node; the last moves
  // none), and their cap. A run that reaches the cap did not settle.
  static constexpr int kMaxHoistSweeps = 64;
  int hoist_sweeps() const { return hoist_sweeps_; }

 private:
  bool hoist_shrinking_;
  int hoist_sweeps_ = 0;
};

}  // namespace tessera::compiler
