#include "tessera/compiler/executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "tessera/base/allocator.h"
#include "tessera/base/error.h"
#include "tessera/compiler/parser.h"

namespace tessera::compiler {

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
  auto* base = static_cast<unsigned char*>(arena_.get());
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
    }
    handles_.push_back(std::move(h));
  }
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
    stats_.bytes_moved += c.bytes;
  }
  parameter_index_.assign(graph_.values.size(), -1);
  for (size_t p = 0; p < graph_.parameters.size(); ++p)
    parameter_index_[static_cast<size_t>(graph_.parameters[p])] = static_cast<int>(p);
  for (const BufferAssignment& b : plan_.values) {
    if (b.kind == BufferAssignment::Kind::Output && b.donor >= 0) donors_.push_back(b.donor);
  }
  kernel_seconds_.assign(instructions_.size(), 0.0);
  const char* profile = std::getenv("TESSERA_PROFILE");
  profiling_ = profile != nullptr && (std::string(profile) == "1" || std::string(profile) == "2");
  stats_.arena_bytes = plan_.arena_bytes;
  stats_.peak_bytes = plan_.peak_bytes;
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
  if (const char* level = std::getenv("TESSERA_PROFILE"); level != nullptr && std::string(level) == "2") {
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
  return os.str();
}

// ---- serialization ----
// Layout (little-endian): "TSRX" magic, u32 version, then length-prefixed sections:
// graph text, donated flags, memory plan entries, constant blobs (in print order).
namespace {

constexpr char kMagic[4] = {'T', 'S', 'R', 'X'};

class Writer {
 public:
  void u32(uint32_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void u64(uint64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void i64(int64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void blob(const void* data, size_t n) {
    u64(n);
    bytes_.append(static_cast<const char*>(data), n);
  }
  void str(const std::string& s) { blob(s.data(), s.size()); }
  std::string take() { return std::move(bytes_); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  template <typename T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str(const char* what) {
    uint64_t n = pod<uint64_t>(what);
    need(n, what);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  void need(uint64_t n, const char* what) {
    if (n > bytes_.size() - pos_)
      fail<ValueError>("executable: truncated bytes reading {} (need {} at offset {}, have {})", what, n, pos_,
                       bytes_.size());
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

// Constants in the order Graph::text prints them.
std::vector<ValueId> constants_in_print_order(const Graph& g) {
  std::vector<ValueId> order;
  std::vector<char> seen(g.values.size(), 0);
  auto add = [&](ValueId v) {
    if (g.value(v).kind == ValueKind::Constant && !seen[static_cast<size_t>(v)]) {
      seen[static_cast<size_t>(v)] = 1;
      order.push_back(v);
    }
  };
  for (const Node& node : g.nodes) {
    if (node.dead) continue;
    for (ValueId in : node.inputs) add(in);
  }
  for (ValueId out : g.outputs) add(out);
  return order;
}

// Values in print order (what the parser numbers %0, %1, ...).
std::vector<ValueId> values_in_print_order(const Graph& g) {
  std::vector<ValueId> order(g.parameters.begin(), g.parameters.end());
  for (ValueId c : constants_in_print_order(g)) order.push_back(c);
  for (const Node& node : g.nodes) {
    if (node.dead) continue;
    for (ValueId out : node.outputs) order.push_back(out);
  }
  return order;
}

}  // namespace

std::string Executable::serialize() const {
  Writer w;
  w.bytes().append(kMagic, 4);
  w.u32(kExecutableFormatVersion);
  w.str(graph_.text());
  w.u64(donated_.size());
  for (bool d : donated_) w.u32(d ? 1 : 0);
  // Plan entries and constants in print order: the parser renumbers values that way.
  std::vector<ValueId> order = values_in_print_order(graph_);
  w.u64(order.size());
  for (ValueId v : order) {
    const BufferAssignment& b = plan_.values[static_cast<size_t>(v)];
    w.u32(static_cast<uint32_t>(b.kind));
    w.u64(b.offset);
    w.u64(b.bytes);
    w.i64(b.index);
    w.i64(b.donor);
    // A view's source as a print-order position.
    int64_t source = -1;
    for (size_t i = 0; i < order.size() && b.source != kNoValue; ++i) {
      if (order[i] == b.source) source = static_cast<int64_t>(i);
    }
    w.i64(source);
  }
  w.u64(plan_.arena_bytes);
  w.u64(plan_.peak_bytes);
  w.u32(static_cast<uint32_t>(plan_.in_place_reuses));
  w.u32(static_cast<uint32_t>(plan_.donations));
  std::vector<ValueId> constants = constants_in_print_order(graph_);
  w.u64(constants.size());
  for (ValueId c : constants) {
    const Array& a = graph_.value(c).constant;
    w.blob(a.raw_data(), a.nbytes());
  }
  return w.take();
}

std::unique_ptr<Executable> Executable::deserialize(const std::string& bytes) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 4) != 0)
    fail<ValueError>("executable: not a serialized tessera executable (bad magic)");
  const std::string body = bytes.substr(4);
  Reader r(body);
  uint32_t version = r.pod<uint32_t>("version");
  if (version != kExecutableFormatVersion)
    fail<ValueError>("executable: format version {} is not supported (this build reads version {})", version,
                     kExecutableFormatVersion);
  std::string text = r.str("graph text");
  uint64_t num_donated = r.pod<uint64_t>("donated count");
  std::vector<bool> donated;
  for (uint64_t i = 0; i < num_donated; ++i) donated.push_back(r.pod<uint32_t>("donated flag") != 0);
  uint64_t num_entries = r.pod<uint64_t>("plan size");
  struct Entry {
    BufferAssignment b;
    int64_t source;
  };
  std::vector<Entry> entries;
  for (uint64_t i = 0; i < num_entries; ++i) {
    Entry e;
    uint32_t kind = r.pod<uint32_t>("plan kind");
    if (kind > static_cast<uint32_t>(BufferAssignment::Kind::View))
      fail<ValueError>("executable: corrupt memory plan (buffer kind {})", kind);
    e.b.kind = static_cast<BufferAssignment::Kind>(kind);
    e.b.offset = r.pod<uint64_t>("plan offset");
    e.b.bytes = r.pod<uint64_t>("plan bytes");
    e.b.index = static_cast<int>(r.pod<int64_t>("plan index"));
    e.b.donor = static_cast<int>(r.pod<int64_t>("plan donor"));
    e.source = r.pod<int64_t>("plan source");
    entries.push_back(e);
  }
  MemoryPlan plan;
  plan.arena_bytes = r.pod<uint64_t>("arena bytes");
  plan.peak_bytes = r.pod<uint64_t>("peak bytes");
  plan.in_place_reuses = static_cast<int>(r.pod<uint32_t>("in-place count"));
  plan.donations = static_cast<int>(r.pod<uint32_t>("donation count"));
  uint64_t num_constants = r.pod<uint64_t>("constant count");
  std::vector<std::string> blobs;
  for (uint64_t i = 0; i < num_constants; ++i) blobs.push_back(r.str("constant"));
  if (!r.done()) fail<ValueError>("executable: trailing bytes after the constants (corrupt)");

  // Large constants print as {bytes=N, hash=H}; the parser takes their data in
  // print order (small ones are read from the text itself).
  std::vector<Array> constants;
  {
    std::istringstream lines(text);
    std::string line;
    size_t next = 0;
    while (std::getline(lines, line)) {
      if (line.find(" = constant {") == std::string::npos) continue;
      if (next >= blobs.size()) fail<ValueError>("executable: more constants in the text than blobs");
      const std::string& blob = blobs[next++];
      if (line.find(" = constant {bytes=") == std::string::npos) continue;
      std::string type_text = line.substr(line.rfind(" : ") + 3);
      const TensorType t = parse_type(type_text);
      if (t.nbytes() != blob.size())
        fail<ValueError>("executable: constant {} has {} bytes (expected {} for {})", next - 1, blob.size(), t.nbytes(),
                         type_text);
      constants.push_back(Array::from_data(blob.data(), t.shape, t.dtype));
    }
  }
  Graph graph = parse_graph(text, constants);
  std::vector<ValueId> order = values_in_print_order(graph);
  if (order.size() != entries.size())
    fail<ValueError>("executable: memory plan has {} entries for {} values", entries.size(), order.size());
  plan.values.resize(graph.values.size());
  for (size_t i = 0; i < order.size(); ++i) {
    BufferAssignment b = entries[i].b;
    if (entries[i].source >= 0) {
      if (entries[i].source >= static_cast<int64_t>(order.size()))
        fail<ValueError>("executable: corrupt memory plan (view source {})", entries[i].source);
      b.source = order[static_cast<size_t>(entries[i].source)];
    }
    plan.values[static_cast<size_t>(order[i])] = b;
  }
  return std::make_unique<Executable>(std::move(graph), std::move(plan), std::move(donated));
}

}  // namespace tessera::compiler
