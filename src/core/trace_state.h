// Whether a transform (vjp, vmap) is tracing a function on this thread. While
// tracing, eval() keeps the graph it ran so the transform can still walk it.
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

}  // namespace tessera::detail
