// Shapes without memory: while an AbstractCreationScope is alive on a thread, full /
// zeros / ones (and what builds on them) return placeholders of the shape and dtype
// instead of allocating and filling. The planner (tessera plan) builds a 70B model's
// optimizer state this way: Optimizer::init gives the state's structure and types, and
// nothing is allocated.
#pragma once

namespace tessera {

class AbstractCreationScope {
 public:
  AbstractCreationScope();
  ~AbstractCreationScope();
  AbstractCreationScope(const AbstractCreationScope&) = delete;
  AbstractCreationScope& operator=(const AbstractCreationScope&) = delete;

 private:
  bool previous_;
};

// Whether an AbstractCreationScope is alive on this thread.
bool abstract_creation();

}  // namespace tessera
