#include "tessera/core/runtime_hooks.h"

#include <atomic>

#include "tessera/base/error.h"
#include "tessera/core/array.h"

namespace tessera::detail {
namespace {

// Installed once at start-up, read on every eval: atomics keep a racing reader defined.
std::atomic<GraphEvaluator> g_evaluator{nullptr};
std::atomic<HostReader> g_sharded_reader{nullptr};
std::atomic<HostReader> g_device_reader{nullptr};

HostReader installed(const std::atomic<HostReader>& reader, const char* what) {
  HostReader r = reader.load(std::memory_order_acquire);
  if (!r)
    fail<Error>("reading {} on the host: no reader is installed (link the `tessera` library, not its core alone)",
                what);
  return r;
}

}  // namespace

void install_graph_evaluator(GraphEvaluator evaluator) { g_evaluator.store(evaluator, std::memory_order_release); }
void install_sharded_reader(HostReader reader) { g_sharded_reader.store(reader, std::memory_order_release); }
void install_device_reader(HostReader reader) { g_device_reader.store(reader, std::memory_order_release); }

void evaluate_graph(const std::vector<Array>& arrays) {
  GraphEvaluator evaluator = g_evaluator.load(std::memory_order_acquire);
  if (!evaluator) fail<Error>("eval: no graph evaluator is installed (link the `tessera` library, not its core alone)");
  evaluator(arrays);
}

void read_to_host(const Array& leaf) {
  ArrayImpl* impl = leaf.impl();
  if (impl->storage) return;
  if (impl->shards) installed(g_sharded_reader, "a sharded array")(leaf);
  if (!impl->storage && impl->device_data) installed(g_device_reader, "a device array")(leaf);
}

}  // namespace tessera::detail
