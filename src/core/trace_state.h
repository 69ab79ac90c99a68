// Per-thread state of the transforms: whether a transform (vjp, vmap, jit) is
// tracing a function (eval() then keeps the graph it ran so the transform can still
// walk it), whether jit is tracing (reading a value is then an error), the
// checkpoint region new ops belong to, and eager mode (every op evaluated as it is
// created: the baseline the jit benchmark compares against).
#pragma once

namespace tessera::detail {

bool tracing();

class TraceScope {
 public:
  TraceScope();
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

bool jit_tracing();

class JitTraceScope {
 public:
  JitTraceScope();
  ~JitTraceScope();
  JitTraceScope(const JitTraceScope&) = delete;
  JitTraceScope& operator=(const JitTraceScope&) = delete;

 private:
  TraceScope trace_;
};

// The checkpoint region ops created now belong to (-1: none).
int current_checkpoint_region();

class CheckpointRegionScope {
 public:
  explicit CheckpointRegionScope(int region);
  ~CheckpointRegionScope();
  CheckpointRegionScope(const CheckpointRegionScope&) = delete;
  CheckpointRegionScope& operator=(const CheckpointRegionScope&) = delete;

 private:
  int previous_;
};

}  // namespace tessera::detail
