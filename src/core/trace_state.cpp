#include "core/trace_state.h"

#include "tessera/core/array.h"

namespace tessera::detail {
namespace {
thread_local int t_depth = 0;
thread_local int t_jit_depth = 0;
thread_local int t_region = -1;
thread_local int t_eager_depth = 0;
}  // namespace

bool tracing() { return t_depth > 0; }
TraceScope::TraceScope() { ++t_depth; }
TraceScope::~TraceScope() { --t_depth; }

bool jit_tracing() { return t_jit_depth > 0; }
JitTraceScope::JitTraceScope() { ++t_jit_depth; }
JitTraceScope::~JitTraceScope() { --t_jit_depth; }

int current_checkpoint_region() { return t_region; }
CheckpointRegionScope::CheckpointRegionScope(int region) : previous_(t_region) { t_region = region; }
CheckpointRegionScope::~CheckpointRegionScope() { t_region = previous_; }

bool eager_mode() { return t_eager_depth > 0; }
EagerScope::EagerScope() { ++t_eager_depth; }
EagerScope::~EagerScope() { --t_eager_depth; }

}  // namespace tessera::detail
