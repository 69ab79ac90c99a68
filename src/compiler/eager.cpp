#include "compiler/eager.h"

#include <cstdlib>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "compiler/lazy_graph.h"
#include "core/trace_state.h"
#include "tessera/base/flags.h"
#include "tessera/compiler/compile.h"

namespace tessera::compiler {

namespace {

// Least-recently-used cache of compiled eval graphs, keyed by their text. Each entry
// keeps its arena, so the cache also has a byte budget (TESSERA_EVAL_CACHE_MB,
// default 256): eager code evaluating one big graph (a whole training step without
// jit) must not pin its activations' arena after the step. An executable larger than
// the budget is run once and not kept.
class EvalCache {
 public:
  static constexpr size_t kCapacity = 2048;

  EvalCache() {
    const char* env = flags::env("TESSERA_EVAL_CACHE_MB");
    if (env != nullptr && *env != 0) budget_bytes_ = static_cast<size_t>(std::strtoull(env, nullptr, 10)) << 20;
  }

  std::shared_ptr<Executable> get(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    entries_.splice(entries_.begin(), entries_, it->second);
    return it->second->second;
  }

  void put(const std::string& key, std::shared_ptr<Executable> exe) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t bytes = exe->stats().arena_bytes;
    if (index_.count(key) || bytes > budget_bytes_) return;
    entries_.emplace_front(key, std::move(exe));
    index_[key] = entries_.begin();
    arena_bytes_ += bytes;
    while (entries_.size() > kCapacity || arena_bytes_ > budget_bytes_) {
      arena_bytes_ -= entries_.back().second->stats().arena_bytes;
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
  }

  // Evicts down to the new budget at once.
  void set_budget(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    budget_bytes_ = bytes;
    while (!entries_.empty() && arena_bytes_ > budget_bytes_) {
      arena_bytes_ -= entries_.back().second->stats().arena_bytes;
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
  }

  EvalCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {hits_, misses_, entries_.size(), arena_bytes_};
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<Executable>>> entries_;
  std::unordered_map<std::string, decltype(entries_)::iterator> index_;
  size_t hits_ = 0, misses_ = 0;
  size_t arena_bytes_ = 0;
  size_t budget_bytes_ = size_t{256} << 20;
};

EvalCache& eval_cache() {
  static EvalCache* cache = new EvalCache();  // never destroyed: eval may run during static destruction
  return *cache;
}

using detail::ArrayImpl;
using detail::OpNode;

[[noreturn]] void fail_placeholder(const Array& requested, const Array& leaf) {
  std::string what = requested.is_leaf()
                         ? "an argument " + type_string(requested)
                         : "the output of " + requested.primitive()->name() + " (" + type_string(requested) + ")";
  if (detail::jit_tracing())
    fail<TransformError>(
        "jit: cannot read the value of {} while tracing: it depends on the traced arguments (placeholder {}); "
        "return it from the function instead",
        what, type_string(leaf));
  fail<TransformError>(
      "eval: cannot read the value of {}: it depends on a traced placeholder {} with no data (values inside a "
      "vmapped or jitted function cannot be read; return them instead)",
      what, type_string(leaf));
}

}  // namespace

EvalCacheStats eval_cache_stats() { return eval_cache().stats(); }

void set_eval_cache_budget(size_t bytes) { eval_cache().set_budget(bytes); }

void eval_arrays(const std::vector<Array>& arrays) {
  // 1. The unevaluated ops behind `arrays` as a graph whose parameters are the
  //    evaluated arrays it reads.
  bool pending = false;
  for (const Array& a : arrays) pending = pending || !a.is_evaluated();
  if (!pending) return;
  LazyGraph lg = build_lazy_graph(arrays, {}, CapturedArrays::AsParameters,
                                  [](const Array& root, const Array& leaf) { fail_placeholder(root, leaf); });
  Graph& graph = lg.graph;
  graph.name = "eval";
  const std::vector<OpNode*>& ops = lg.ops;
  if (ops.empty()) return;

  // 3. Outputs: the requested arrays, and every intermediate someone else still
  //    holds (a variable of the caller, a transform walking the graph, an op outside
  //    this subgraph): it must get its value now. An array's references from inside
  //    the subgraph are the op inputs that read it and the `arrays` entries.
  std::unordered_map<const ArrayImpl*, long> internal_refs;
  for (OpNode* op : ops) {
    for (const Array& in : op->inputs) ++internal_refs[in.impl()];
  }
  for (const Array& a : arrays) ++internal_refs[a.impl()];
  std::vector<std::shared_ptr<ArrayImpl>> bound;  // impls receiving the outputs, in graph-output order
  std::unordered_map<ValueId, size_t> output_slot;
  auto add_output = [&](const std::shared_ptr<ArrayImpl>& impl, ValueId v) {
    if (output_slot.count(v)) return;
    output_slot[v] = graph.outputs.size();
    graph.outputs.push_back(v);
    bound.push_back(impl);
  };
  for (const Array& a : arrays) {
    if (a.is_evaluated()) continue;
    add_output(a.impl_ptr(), lg.value_of(a));
  }
  for (OpNode* op : ops) {
    for (size_t i = 0; i < op->outputs.size(); ++i) {
      std::shared_ptr<ArrayImpl> held = op->outputs[i].lock();
      if (!held) continue;
      auto it = internal_refs.find(held.get());
      long internal = it == internal_refs.end() ? 0 : it->second;
      if (held.use_count() - 1 > internal) add_output(held, lg.produced.at({op, static_cast<int>(i)}));
    }
  }

  // 4. Compile (or reuse) and run.
  std::string key = graph.text();
  std::shared_ptr<Executable> exe = eval_cache().get(key);
  if (!exe) {
    exe = std::shared_ptr<Executable>(compile(std::move(graph)).release());
    eval_cache().put(key, exe);
  }
  std::vector<Array> results = exe->run(lg.captured);
  for (size_t o = 0; o < bound.size(); ++o) bound[o]->storage = results[o].storage();

  // Outside transforms the evaluated part of the graph is no longer needed: drop it
  // so intermediate buffers are freed.
  if (!detail::tracing()) {
    for (const auto& impl : bound) impl->op.reset();
  }
}

}  // namespace tessera::compiler
