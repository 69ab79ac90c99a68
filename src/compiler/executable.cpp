#include "tessera/compiler/executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>

#include "tessera/base/allocator.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/ir/primitives/matmul_epilogue.h"

namespace tessera::compiler {

namespace {

// ExecutableStats::flops_by_op's key: the op name, with int8 GEMMs fused with their
// epilogue told apart from the float ones ("matmul_epilogue[int8]").
std::string flops_key(const Primitive& p) {
  const auto* epilogue = dynamic_cast<const MatmulEpilogue*>(&p);
  return epilogue && epilogue->options().int8 ? "matmul_epilogue[int8]" : p.name();
}

}  // namespace

namespace {

// Errors a kernel raises at run time (an index out of range, a bad target) are
// reported under the name of the op, keeping their type.
template <typename E>
bool rethrow_as(const Error& e, const std::string& message) {
  if (dynamic_cast<const E*>(&e)) throw E(message);
  return false;
}

[[noreturn]] void rethrow_with_op(const Error& e, const std::string& op) {
  std::string what = e.what();
  if (what.rfind(op, 0) == 0) throw;
  std::string message = op + ": " + what;
  rethrow_as<ShapeError>(e, message) || rethrow_as<DTypeError>(e, message) || rethrow_as<AxisError>(e, message) ||
      rethrow_as<ValueError>(e, message) || rethrow_as<TransformError>(e, message);
  throw Error(message);
}

Array handle_for(const TensorType& type) { return Array::placeholder(type.shape, type.dtype); }

// A 0xFF byte pattern is a NaN in every float format and -1 in every signed integer:
// a kernel reading a freed region produces visibly wrong results.
constexpr unsigned char kPoison = 0xFF;

}  // namespace

Executable::Executable(Graph graph, MemoryPlan plan, std::vector<bool> donated)
    : graph_(std::move(graph)), plan_(std::move(plan)), donated_(std::move(donated)) {
  if (plan_.values.size() != graph_.values.size())
    fail<Error>("executable: memory plan covers {} values, graph has {}", plan_.values.size(), graph_.values.size());
  donated_.resize(graph_.parameters.size(), false);
  // Checkpoint tags have been applied by the remat pass; the program no longer needs them.
  for (Node& node : graph_.nodes) {
    node.remat_region = -1;
    node.remat_name.clear();
  }
  graph_.remat_regions.clear();
  if (plan_.arena_bytes > 0) {
    size_t capacity = 0;
    void* data = allocate_buffer(plan_.arena_bytes, &capacity);
    arena_ = std::shared_ptr<void>(data, [capacity](void* p) { free_buffer(p, capacity); });
  }
  if (plan_.host_arena_bytes > 0) {
    size_t capacity = 0;
    void* data = allocate_buffer(plan_.host_arena_bytes, &capacity);
    host_arena_ = std::shared_ptr<void>(data, [capacity](void* p) { free_buffer(p, capacity); });
  }
  auto* base = static_cast<unsigned char*>(arena_.get());
  auto* host_base = static_cast<unsigned char*>(host_arena_.get());
  handles_.reserve(graph_.values.size());
  for (size_t v = 0; v < graph_.values.size(); ++v) {
    const Value& value = graph_.values[v];
    Array h = handle_for(value.type);
    const BufferAssignment& b = plan_.values[v];
    if (value.kind == ValueKind::Constant) {
      h.bind_storage(value.constant.storage());
    } else if (b.kind == BufferAssignment::Kind::Arena) {
      if (b.offset + value.type.nbytes() > plan_.arena_bytes)
        fail<Error>("executable: value %{} at [{}, {}) lies outside the {}-byte arena", v, b.offset,
                    b.offset + value.type.nbytes(), plan_.arena_bytes);
      h.bind_storage(Storage::view(base + b.offset, value.type.nbytes()));
    } else if (b.kind == BufferAssignment::Kind::Host) {
      if (b.offset + value.type.nbytes() > plan_.host_arena_bytes)
        fail<Error>("executable: host value %{} at [{}, {}) lies outside the {}-byte host arena", v, b.offset,
                    b.offset + value.type.nbytes(), plan_.host_arena_bytes);
      h.bind_storage(Storage::view(host_base + b.offset, value.type.nbytes()));
    }
    handles_.push_back(std::move(h));
  }
  instructions_.reserve(graph_.nodes.size());
  for (size_t n = 0; n < graph_.nodes.size(); ++n) {
    const Node& node = graph_.nodes[n];
    if (node.dead) continue;
    Instruction inst;
    inst.primitive = node.primitive.get();
    inst.node = static_cast<int>(n);
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.primitive->aliases_input(static_cast<int>(o)) >= 0 &&
          plan_.values[static_cast<size_t>(node.outputs[o])].kind == BufferAssignment::Kind::Output)
        inst.view_output = static_cast<int>(o);
    }
    for (ValueId in : node.inputs) inst.inputs.push_back(handles_[static_cast<size_t>(in)]);
    for (ValueId out : node.outputs) inst.outputs.push_back(handles_[static_cast<size_t>(out)]);
    instructions_.push_back(std::move(inst));
    Cost c = node.primitive->cost(instructions_.back().inputs, instructions_.back().outputs);
    stats_.flops += c.flops;
    if (c.flops > 0) stats_.flops_by_op[flops_key(*node.primitive)] += c.flops;
    stats_.bytes_moved += c.bytes;
  }
  parameter_index_.assign(graph_.values.size(), -1);
  for (size_t p = 0; p < graph_.parameters.size(); ++p)
    parameter_index_[static_cast<size_t>(graph_.parameters[p])] = static_cast<int>(p);
  for (const BufferAssignment& b : plan_.values) {
    if (b.kind == BufferAssignment::Kind::Output && b.donor >= 0) donors_.push_back(b.donor);
  }
  kernel_seconds_.assign(instructions_.size(), 0.0);
  const char* profile = flags::env("TESSERA_PROFILE");
  profiling_ = profile != nullptr && (std::string(profile) == "1" || std::string(profile) == "2");
  stats_.arena_bytes = plan_.arena_bytes;
  stats_.peak_bytes = plan_.peak_bytes;
  stats_.host_bytes = plan_.host_arena_bytes;
  stats_.offloaded_bytes = plan_.offloaded_bytes;
  stats_.kernels = instructions_.size();
}

void Executable::bind(const std::vector<Array>& args, const std::vector<Array>* outputs) {
  if (args.size() != graph_.parameters.size())
    fail<ValueError>("executable @{}: called with {} arguments (expected {})", graph_.name, args.size(),
                     graph_.parameters.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const TensorType& want = graph_.type(graph_.parameters[i]);
    if (args[i].shape() != want.shape || args[i].dtype() != want.dtype)
      fail<ValueError>("executable @{}: argument {} is {} (expected {})", graph_.name, i, type_string(args[i]),
                       to_string(want));
    args[i].eval();
    handles_[static_cast<size_t>(graph_.parameters[i])].bind_storage(args[i].storage());
  }
  for (size_t o = 0; o < graph_.outputs.size(); ++o) {
    ValueId v = graph_.outputs[o];
    const BufferAssignment& b = plan_.values[static_cast<size_t>(v)];
    if (b.kind != BufferAssignment::Kind::Output || b.index != static_cast<int>(o)) continue;
    const Array& h = handles_[static_cast<size_t>(v)];
    if (outputs != nullptr) {
      const Array& dst = (*outputs)[o];
      if (dst.shape() != graph_.type(v).shape || dst.dtype() != graph_.type(v).dtype || !dst.storage())
        fail<ValueError>("executable @{}: output {} is {} (expected an allocated {})", graph_.name, o, type_string(dst),
                         to_string(graph_.type(v)));
      h.bind_storage(dst.storage());
    } else if (b.donor >= 0) {
      h.bind_storage(args[static_cast<size_t>(b.donor)].storage());
    } else {
      h.bind_storage(std::make_shared<Storage>(graph_.type(v).nbytes()));
    }
  }
}

void Executable::execute() {
  ++runs_;
  auto* base = static_cast<unsigned char*>(arena_.get());
  std::vector<LiveRange> ranges;
  if (poison_freed_) ranges = live_ranges(graph_);
  for (size_t position = 0; position < instructions_.size(); ++position) {
    Instruction& inst = instructions_[position];
    const int n = inst.node;
    if (poison_freed_ && base != nullptr) {
      // Poison every arena byte no value live across this node occupies.
      std::vector<char> live(plan_.arena_bytes, 0);
      for (size_t v = 0; v < graph_.values.size(); ++v) {
        const BufferAssignment& b = plan_.values[v];
        if (b.kind != BufferAssignment::Kind::Arena) continue;
        if (ranges[v].begin < n && ranges[v].end >= n)
          std::memset(live.data() + b.offset, 1, graph_.values[v].type.nbytes());
      }
      for (size_t i = 0; i < plan_.arena_bytes; ++i) {
        if (!live[i]) base[i] = kPoison;
      }
    }
    // A view returned to the caller must own its bytes: the kernel shares the input's
    // buffer, then it is copied into the output buffer bound for it.
    std::shared_ptr<Storage> bound_view_output;
    if (inst.view_output >= 0) bound_view_output = inst.outputs[static_cast<size_t>(inst.view_output)].storage();
    auto start = profiling_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    try {
      inst.primitive->eval_cpu(inst.inputs, inst.outputs);
    } catch (const Error& e) {
      rethrow_with_op(e, inst.primitive->name());
    }
    if (profiling_)
      kernel_seconds_[position] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (inst.view_output >= 0) {
      // Views of parameters, constants or other outputs keep sharing (like eager
      // reshape); only bytes in the arena, which the next run overwrites, are copied.
      const Array& out = inst.outputs[static_cast<size_t>(inst.view_output)];
      const auto* shared = static_cast<const unsigned char*>(out.storage()->data);
      const bool in_arena = base != nullptr && shared >= base && shared < base + plan_.arena_bytes;
      if (out.storage() != bound_view_output && in_arena) {
        std::memcpy(bound_view_output->data, out.storage()->data, out.nbytes());
        out.bind_storage(bound_view_output);
      }
    }
  }
}

std::string Executable::profile_text() const {
  std::map<std::string, std::pair<double, int64_t>> by_op;
  double total = 0;
  for (size_t i = 0; i < instructions_.size(); ++i) {
    auto& [seconds, calls] = by_op[instructions_[i].primitive->name()];
    seconds += kernel_seconds_[i];
    ++calls;
    total += kernel_seconds_[i];
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string s = fmt::format("{:<20} {:>8} {:>12} {:>7}\n", "op", "kernels", "ms/run", "share");
  if (const char* level = flags::env("TESSERA_PROFILE"); level != nullptr && std::string(level) == "2") {
    // One row per instruction: where a family's time goes, shape by shape, with GFLOP/s.
    std::vector<size_t> order(instructions_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return kernel_seconds_[a] > kernel_seconds_[b]; });
    const double n = static_cast<double>(std::max<int64_t>(runs_, 1));
    for (size_t i : order) {
      const Instruction& in = instructions_[i];
      std::string types;
      for (const Array& a : in.inputs) types += (types.empty() ? "" : ", ") + type_string(a);
      const double flops = in.primitive->cost(in.inputs, in.outputs).flops;
      const double sec = kernel_seconds_[i] / n;
      s += fmt::format("  {:>8.3f} ms {:>7.1f} GFLOP/s  {}({}) -> {}\n", 1e3 * sec, sec > 0 ? flops / sec / 1e9 : 0.0,
                       in.primitive->name(), types, type_string(in.outputs.at(0)));
    }
  }
  const double runs = static_cast<double>(std::max<int64_t>(runs_, 1));
  for (const auto& [name, v] : rows)
    s += fmt::format("{:<20} {:>8} {:>12.3f} {:>6.1f}%\n", name, v.second, 1e3 * v.first / runs,
                     total > 0 ? 100 * v.first / total : 0.0);
  return s;
}

std::vector<bool> Executable::owned_outputs() const {
  using Kind = BufferAssignment::Kind;
  // The value whose buffer v's array holds after run(): a view reads its source's; an
  // output that views an input outside the arena keeps that input's (execute()).
  std::function<ValueId(ValueId)> buffer_of = [&](ValueId v) {
    const BufferAssignment& b = plan_.values[static_cast<size_t>(v)];
    if (b.kind == Kind::View) return buffer_of(b.source);
    const Value& value = graph_.value(v);
    if (b.kind == Kind::Output && value.kind == ValueKind::NodeOutput) {
      const Node& node = graph_.nodes[static_cast<size_t>(value.node)];
      const int input = node.primitive->aliases_input(value.output_index);
      if (input >= 0) {
        const ValueId source = buffer_of(node.inputs[static_cast<size_t>(input)]);
        if (plan_.values[static_cast<size_t>(source)].kind != Kind::Arena) return source;
      }
    }
    return v;
  };
  std::map<ValueId, int> readers;
  for (ValueId v : graph_.outputs) ++readers[buffer_of(v)];
  std::vector<bool> owned;
  for (size_t o = 0; o < graph_.outputs.size(); ++o) {
    const ValueId v = graph_.outputs[o];
    const BufferAssignment& b = plan_.values[static_cast<size_t>(v)];
    owned.push_back(buffer_of(v) == v && b.kind == Kind::Output && b.index == static_cast<int>(o) && readers[v] == 1);
  }
  return owned;
}

void Executable::unbind() {
  for (ValueId p : graph_.parameters) handles_[static_cast<size_t>(p)].bind_storage(nullptr);
  for (size_t v = 0; v < graph_.values.size(); ++v) {
    auto kind = plan_.values[v].kind;
    if (kind == BufferAssignment::Kind::Output || kind == BufferAssignment::Kind::View)
      handles_[v].bind_storage(nullptr);
  }
}

std::vector<Array> Executable::run(const std::vector<Array>& args) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Array> results;
  try {
    bind(args, nullptr);
    execute();
    results.reserve(graph_.outputs.size());
    for (size_t o = 0; o < graph_.outputs.size(); ++o) {
      ValueId v = graph_.outputs[o];
      const Value& value = graph_.value(v);
      if (value.kind == ValueKind::Parameter) {
        results.push_back(args[static_cast<size_t>(parameter_index_[static_cast<size_t>(v)])]);
      } else if (value.kind == ValueKind::Constant) {
        results.push_back(value.constant);
      } else {
        Array r = handle_for(value.type);
        r.bind_storage(handles_[static_cast<size_t>(v)].storage());
        results.push_back(std::move(r));
      }
    }
    // Donated arguments whose buffers now hold outputs are no longer valid inputs.
    for (int donor : donors_) args[static_cast<size_t>(donor)].bind_storage(nullptr);
  } catch (...) {
    unbind();
    throw;
  }
  unbind();
  return results;
}

void Executable::run_into(const std::vector<Array>& args, const std::vector<Array>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (outputs.size() != graph_.outputs.size())
    fail<ValueError>("executable @{}: run_into got {} outputs (expected {})", graph_.name, outputs.size(),
                     graph_.outputs.size());
  try {
    bind(args, &outputs);
    execute();
    for (size_t o = 0; o < graph_.outputs.size(); ++o) {
      ValueId v = graph_.outputs[o];
      const Array& src = handles_[static_cast<size_t>(v)];
      const Value& value = graph_.value(v);
      const void* from = nullptr;
      if (value.kind == ValueKind::Parameter) {
        from = args[static_cast<size_t>(parameter_index_[static_cast<size_t>(v)])].raw_data();
      } else if (value.kind == ValueKind::Constant) {
        from = value.constant.raw_data();
      } else if (src.storage() != outputs[o].storage()) {
        from = src.storage()->data;  // a repeated output: copy the first occurrence
      }
      if (from != nullptr && from != outputs[o].storage()->data)
        std::memcpy(outputs[o].mutable_raw_data(), from, outputs[o].nbytes());
    }
  } catch (...) {
    unbind();
    throw;
  }
  unbind();
}

std::string Executable::text() const {
  std::ostringstream os;
  os << graph_.text();
  os << fmt::format("// arena {} bytes, peak {} bytes, {} kernels, {:.6g} flops, {} in place, {} donated\n",
                    stats_.arena_bytes, stats_.peak_bytes, stats_.kernels, stats_.flops, plan_.in_place_reuses,
                    plan_.donations);
  if (plan_.offloaded_values > 0)
    os << fmt::format("// host offload: {} values, {} bytes off the device, host arena {} bytes\n",
                      plan_.offloaded_values, plan_.offloaded_bytes, plan_.host_arena_bytes);
  return os.str();
}

}  // namespace tessera::compiler
