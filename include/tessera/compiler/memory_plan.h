// Static memory planning: liveness of every value over the schedule (the order of
// Graph::nodes) -> a byte offset in one arena per value, so running the program
// allocates nothing. Buffers whose lifetimes do not overlap share bytes; an
// elementwise op may write its output over an input that dies there (in place);
// views (reshape, identity) share their input's buffer; graph outputs get their
// own buffers (or a donated parameter's buffer) because the caller keeps them.
// Values a primitive writes to host memory (offload_to_host, the offload remat
// policy) are planned the same way in a second, host arena: they count toward
// host_arena_bytes and offloaded_bytes, never toward the device peak.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/compiler/graph.h"

namespace tessera::compiler {

struct BufferAssignment {
  enum class Kind {
    Arena,      // bytes [offset, offset + bytes) of the arena
    Parameter,  // the caller's buffer of parameter `index`
    Constant,   // the constant's own buffer
    Output,     // a buffer handed to the caller as output `index` (allocated per call
                // unless the caller supplies it, or donated parameter `donor` is reused)
    View,       // the buffer of value `source` (reshape, identity)
    Host,       // bytes [offset, offset + bytes) of the host arena (Primitive::output_in_host_memory)
  };
  Kind kind = Kind::Arena;
  size_t offset = 0;
  size_t bytes = 0;
  int index = -1;
  int donor = -1;             // Output: the donated parameter whose buffer it reuses, or -1
  ValueId source = kNoValue;  // View
};

struct MemoryPlanOptions {
  std::vector<bool> donated;  // per parameter: its buffer may be reused for an output
  size_t alignment = 64;
  bool in_place = true;  // let outputs overwrite dying inputs (Primitive::can_write_in_place)
};

struct MemoryPlan {
  std::vector<BufferAssignment> values;  // indexed by ValueId
  size_t arena_bytes = 0;                // peak: the arena's size
  // Bytes the program holds at its peak counting outputs and live parameters too
  // (what a profiler would report for the step).
  size_t peak_bytes = 0;
  int in_place_reuses = 0;  // outputs written over a dying input
  int donations = 0;        // outputs written into a donated parameter
  // Host offload: the host arena's size (pinned memory on a GPU), and the bytes of
  // the values copied into it: the device bytes those activations would otherwise
  // hold from the end of their forward use to their backward use.
  size_t host_arena_bytes = 0;
  size_t offloaded_bytes = 0;
  int offloaded_values = 0;
  // One line per value: "%7 arena [4096, 8192)" / "%2 param 0" / "%9 view of %7" /
  // "%12 host [0, 4096)" ...
  std::string text(const Graph& graph) const;
};

// Liveness interval of each value in schedule positions: a value is live from the
// node that defines it (parameters and constants: -1) to its last reader (graph
// outputs: nodes.size()). Views extend their source's interval.
struct LiveRange {
  int begin = -1;
  int end = -1;
};
std::vector<LiveRange> live_ranges(const Graph& graph);

MemoryPlan plan_memory(const Graph& graph, const MemoryPlanOptions& options = {});

}  // namespace tessera::compiler
