#include "core/trace_state.h"

namespace tessera::detail {
namespace {
thread_local int t_depth = 0;
}

bool tracing() { return t_depth > 0; }
TraceScope::TraceScope() { ++t_depth; }
TraceScope::~TraceScope() { --t_depth; }

}  // namespace tessera::detail
