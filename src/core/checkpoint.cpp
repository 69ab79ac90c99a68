#include "tessera/core/checkpoint.h"

#include <fmt/format.h>

#include <deque>
#include <mutex>
#include <set>
#include <string>

#include "core/trace_state.h"
#include "tessera/ir/primitives/elementwise.h"

namespace tessera {

namespace {

// Policies of every region ever opened (ids are global so graphs traced on any
// thread can name them). A deque keeps references stable while it grows.
std::mutex g_regions_mutex;
std::deque<CheckpointPolicy>& regions() {
  static auto* r = new std::deque<CheckpointPolicy>();
  return *r;
}

int open_region(const CheckpointPolicy& policy) {
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  regions().push_back(policy);
  return static_cast<int>(regions().size()) - 1;
}

// Outputs of the checkpointed function are kept (the next layer reads them anyway);
// the remat pass recognizes them by this name.
void mark_outputs(const std::vector<Array>& outs, int region) {
  for (const Array& o : outs) {
    auto& op = o.impl()->op;
    if (op && op->remat_region == region) op->remat_name = "__output__";
  }
}

// The names checkpoint_name gave inside the innermost open region (of this thread).
thread_local std::set<std::string>* t_region_names = nullptr;

// An offload policy that lists a name no op of its region carries is a typo: the
// value would silently stay on the device. Checked here, where the whole region is
// known; a compiled graph may hold only a fragment of it (eager ops flush in pieces).
void check_offloaded_names(const CheckpointPolicy& policy, int region, const std::set<std::string>& carried) {
  if (policy.kind != CheckpointPolicy::Kind::Offload) return;
  for (const std::string& name : policy.saved_names) {
    if (carried.count(name)) continue;
    fail<ValueError>(
        "checkpoint policy {} (region {}): no op in the region carries the name '{}' (names it carries: {}); tag "
        "the value with checkpoint_name(x, \"{}\") inside the checkpointed function or drop the name",
        policy.text(), region, name, carried.empty() ? "none" : fmt::format("{}", fmt::join(carried, ", ")), name);
  }
}

}  // namespace

std::string CheckpointPolicy::text() const {
  switch (kind) {
    case Kind::None:
      return "none";
    case Kind::Full:
      return "full";
    case Kind::SaveNamed:
      return fmt::format("save_named[{}]", fmt::join(saved_names, ", "));
    case Kind::Offload:
      return fmt::format("offload[{}]", fmt::join(saved_names, ", "));
  }
  return "?";
}

namespace detail {
const CheckpointPolicy& checkpoint_policy(int region) {
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  if (region < 0 || region >= static_cast<int>(regions().size()))
    fail<ValueError>("checkpoint: unknown region {}", region);
  return regions()[static_cast<size_t>(region)];
}
int new_checkpoint_region(const CheckpointPolicy& policy) { return open_region(policy); }
}  // namespace detail

ArrayFn checkpoint(ArrayFn fn, CheckpointPolicy policy) {
  return [fn = std::move(fn), policy = std::move(policy)](const std::vector<Array>& args) {
    if (policy.kind == CheckpointPolicy::Kind::None) return fn(args);
    int region = open_region(policy);
    std::vector<Array> outs;
    std::set<std::string> names;
    std::set<std::string>* outer_names = t_region_names;
    {
      detail::CheckpointRegionScope scope(region);
      t_region_names = &names;
      try {
        outs = fn(args);
      } catch (...) {
        t_region_names = outer_names;
        throw;
      }
      t_region_names = outer_names;
    }
    check_offloaded_names(policy, region, names);
    mark_outputs(outs, region);
    return outs;
  };
}

std::function<Array(const Array&)> checkpoint(std::function<Array(const Array&)> fn, CheckpointPolicy policy) {
  ArrayFn wrapped = checkpoint(
      [fn = std::move(fn)](const std::vector<Array>& a) { return std::vector<Array>{fn(a[0])}; }, std::move(policy));
  return [wrapped](const Array& x) { return wrapped({x})[0]; };
}

Array checkpoint_name(const Array& x, const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0)
    fail<ValueError>("checkpoint_name: name '{}' is empty or reserved (names starting with __)", name);
  Array y = Array::make(x.shape(), x.dtype(), std::make_shared<Identity>(), {x});
  y.impl()->op->remat_name = name;
  if (t_region_names != nullptr) t_region_names->insert(name);
  return y;
}

}  // namespace tessera
