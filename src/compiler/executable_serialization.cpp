// Executable::serialize / deserialize: the compiled program as binary records, so a
// warm start (the persistent compilation cache, compiler/compilation_cache.h) rebuilds
// the Executable without re-running passes or planning and without lexing IR text.
//
// Format version 2 (little-endian):
//   "TSRX", u32 version, u64 body length, u64 XXH3-64 of the body, then the body:
//   donation   u64 count, one u8 per parameter
//   name       u64 length + bytes
//   values     u64 count; per value (by ValueId): u8 kind, u8 dtype, u8 dead, u8 has
//              data, i32 producing node, i32 output index, u32 rank, i64 dims; a
//              constant's bytes (u64 length + bytes) when it has data
//   parameters u64 count + i32 ids;  outputs: u64 count + i32 ids
//   nodes      u64 count; per node (schedule order): u8 dead, op name and attribute
//              text (u64 length + bytes each; make_primitive reads them back), u32
//              input count + i32 ids, u32 output count + i32 ids
//   plan       u64 count (= values); per value: u8 kind, u64 offset, u64 bytes, i32
//              index, i32 donor, i32 source; then u64 arena bytes, u64 peak bytes,
//              u32 in-place reuses, u32 donations
// Values keep their ids, so the loaded graph, plan and executable are the compiled
// ones exactly (version 1 stored the graph's IR text and re-parsed it: 3 ms of a 4 ms
// gpt2-124m load). Every count and id is checked against what is left and against the
// graph (Graph::verify), and the body hash catches flipped bytes, so damaged bytes
// throw ValueError rather than building a wrong program.
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "tessera/base/bytes.h"
#include "tessera/base/error.h"
#include "tessera/compiler/executable.h"
#include "tessera/compiler/primitive_registry.h"

// Header-only use of libxxhash (the core library does not link it).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::compiler {

namespace {

constexpr char kMagic[4] = {'T', 'S', 'R', 'X'};
constexpr size_t kPreambleBytes = sizeof(kMagic) + sizeof(uint32_t) + 2 * sizeof(uint64_t);
constexpr uint32_t kMaxRank = 64;

// The value-id lists of graphs: a u64 count, then int32 ids.
void write_ids(ByteWriter& w, const std::vector<ValueId>& ids) {
  w.pod<uint64_t>(ids.size());
  for (ValueId v : ids) w.pod<int32_t>(v);
}

// A value id read from the bytes: in range, or kNoValue where `allow_none`.
ValueId checked_id(int32_t id, size_t num_values, const char* what, bool allow_none = false) {
  if ((allow_none && id == kNoValue) || (id >= 0 && static_cast<size_t>(id) < num_values)) return id;
  fail<ValueError>("executable: corrupt bytes: {} names value {} of {}", what, id, num_values);
}

std::vector<ValueId> read_ids(ByteReader& r, size_t num_values, const char* what) {
  std::vector<ValueId> ids(r.count(what, sizeof(int32_t)));
  for (ValueId& v : ids) v = checked_id(r.pod<int32_t>(what), num_values, what);
  return ids;
}

void write_graph(ByteWriter& w, const Graph& g) {
  w.str(g.name);
  w.pod<uint64_t>(g.values.size());
  for (const Value& v : g.values) {
    const bool has_data = v.kind == ValueKind::Constant && v.constant.valid();
    w.pod<uint8_t>(static_cast<uint8_t>(v.kind));
    w.pod<uint8_t>(static_cast<uint8_t>(v.type.dtype));
    w.pod<uint8_t>(v.dead ? 1 : 0);
    w.pod<uint8_t>(has_data ? 1 : 0);
    w.pod<int32_t>(v.node);
    w.pod<int32_t>(v.output_index);
    w.pod<uint32_t>(static_cast<uint32_t>(v.type.shape.size()));
    for (int64_t d : v.type.shape) w.pod<int64_t>(d);
    if (has_data) {
      v.constant.eval();
      w.blob(v.constant.raw_data(), v.constant.nbytes());
    }
  }
  write_ids(w, g.parameters);
  write_ids(w, g.outputs);
  w.pod<uint64_t>(g.nodes.size());
  for (const Node& node : g.nodes) {
    w.pod<uint8_t>(node.dead ? 1 : 0);
    // A dead node's primitive is never run or rebuilt.
    const bool keep = !node.dead && node.primitive;
    w.str(keep ? node.primitive->name() : std::string());
    w.str(keep ? node.primitive->attributes() : std::string());
    w.pod<uint32_t>(static_cast<uint32_t>(node.inputs.size()));
    for (ValueId v : node.inputs) w.pod<int32_t>(v);
    w.pod<uint32_t>(static_cast<uint32_t>(node.outputs.size()));
    for (ValueId v : node.outputs) w.pod<int32_t>(v);
  }
}

Graph read_graph(ByteReader& r) {
  Graph g;
  g.name = std::string(r.blob("graph name"));
  // The smallest value record: 4 u8 fields, 2 i32, a u32 rank.
  g.values.resize(r.count("value count", 16));
  const size_t num_values = g.values.size();
  for (size_t i = 0; i < num_values; ++i) {
    Value& v = g.values[i];
    const auto kind = r.pod<uint8_t>("value kind");
    const auto dtype = r.pod<uint8_t>("value dtype");
    if (kind > static_cast<uint8_t>(ValueKind::NodeOutput) || dtype >= kNumDTypes)
      fail<ValueError>("executable: corrupt bytes: value %{} has kind {} and dtype {}", i, kind, dtype);
    v.kind = static_cast<ValueKind>(kind);
    v.type.dtype = static_cast<DType>(dtype);
    v.dead = r.pod<uint8_t>("value dead flag") != 0;
    const bool has_data = r.pod<uint8_t>("value data flag") != 0;
    v.node = r.pod<int32_t>("value node");
    v.output_index = r.pod<int32_t>("value output index");
    const auto rank = r.pod<uint32_t>("value rank");
    if (rank > kMaxRank) fail<ValueError>("executable: corrupt bytes: value %{} has rank {}", i, rank);
    v.type.shape.resize(rank);
    for (int64_t& d : v.type.shape) {
      d = r.pod<int64_t>("value dimension");
      if (d < 0) fail<ValueError>("executable: corrupt bytes: value %{} has dimension {}", i, d);
    }
    if (has_data) {
      if (v.kind != ValueKind::Constant)
        fail<ValueError>("executable: corrupt bytes: value %{} has data but is no constant", i);
      const std::string_view data = r.blob("constant data");
      if (data.size() != v.type.nbytes())
        fail<ValueError>("executable: constant %{} has {} bytes (expected {} for {})", i, data.size(), v.type.nbytes(),
                         to_string(v.type));
      v.constant = Array::from_data(data.data(), v.type.shape, v.type.dtype);
    }
  }
  g.parameters = read_ids(r, num_values, "parameter");
  g.outputs = read_ids(r, num_values, "output");
  // The smallest node record: a u8, two empty strings, two u32 counts.
  g.nodes.resize(r.count("node count", 25));
  // Nodes of equal op and attributes share one primitive: a primitive is a function of
  // its name and attributes alone (Primitive::is_equivalent; the one state a kernel
  // keeps, Fusion's lowered program, follows from its attributes too), and
  // make_primitive is most of a load otherwise (gpt2-124m: 1305 nodes, 55 distinct).
  std::unordered_map<std::string, PrimitivePtr> made;
  std::string spelling;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    Node& node = g.nodes[n];
    node.dead = r.pod<uint8_t>("node dead flag") != 0;
    const std::string_view op = r.blob("op name");
    const std::string_view attributes = r.blob("op attributes");
    if (!op.empty()) {
      spelling.assign(op).append(1, '\0').append(attributes);
      PrimitivePtr& primitive = made[spelling];
      if (!primitive) primitive = make_primitive(std::string(op), std::string(attributes));
      node.primitive = primitive;
    }
    node.inputs.resize(r.count<uint32_t>("input count", sizeof(int32_t)));
    for (ValueId& v : node.inputs) v = checked_id(r.pod<int32_t>("node input"), num_values, "a node input");
    node.outputs.resize(r.count<uint32_t>("output count", sizeof(int32_t)));
    for (ValueId& v : node.outputs) v = checked_id(r.pod<int32_t>("node output"), num_values, "a node output");
  }
  try {
    g.verify();
  } catch (const Error& e) {
    fail<ValueError>("executable: corrupt bytes: {}", e.what());
  }
  return g;
}

void write_plan(ByteWriter& w, const MemoryPlan& plan) {
  w.pod<uint64_t>(plan.values.size());
  for (const BufferAssignment& b : plan.values) {
    w.pod<uint8_t>(static_cast<uint8_t>(b.kind));
    w.pod<uint64_t>(b.offset);
    w.pod<uint64_t>(b.bytes);
    w.pod<int32_t>(b.index);
    w.pod<int32_t>(b.donor);
    w.pod<int32_t>(b.source);
  }
  w.pod<uint64_t>(plan.arena_bytes);
  w.pod<uint64_t>(plan.peak_bytes);
  w.pod<uint32_t>(static_cast<uint32_t>(plan.in_place_reuses));
  w.pod<uint32_t>(static_cast<uint32_t>(plan.donations));
  w.pod<uint64_t>(plan.host_arena_bytes);
  w.pod<uint64_t>(plan.offloaded_bytes);
  w.pod<uint32_t>(static_cast<uint32_t>(plan.offloaded_values));
}

MemoryPlan read_plan(ByteReader& r, const Graph& g) {
  MemoryPlan plan;
  plan.values.resize(r.count("plan size", 29));
  if (plan.values.size() != g.values.size())
    fail<ValueError>("executable: memory plan has {} entries for {} values", plan.values.size(), g.values.size());
  for (size_t v = 0; v < plan.values.size(); ++v) {
    BufferAssignment& b = plan.values[v];
    const auto kind = r.pod<uint8_t>("plan kind");
    if (kind > static_cast<uint8_t>(BufferAssignment::Kind::Host))
      fail<ValueError>("executable: corrupt memory plan (buffer kind {} of %{})", kind, v);
    b.kind = static_cast<BufferAssignment::Kind>(kind);
    b.offset = r.pod<uint64_t>("plan offset");
    b.bytes = r.pod<uint64_t>("plan bytes");
    b.index = r.pod<int32_t>("plan index");
    b.donor = r.pod<int32_t>("plan donor");
    b.source = checked_id(r.pod<int32_t>("plan source"), g.values.size(), "a view's source", /*allow_none=*/true);
    // Output indices and donors index the caller's arrays at run time.
    if (b.kind == BufferAssignment::Kind::Output && (b.index < 0 || static_cast<size_t>(b.index) >= g.outputs.size() ||
                                                     b.donor < -1 || b.donor >= static_cast<int>(g.parameters.size())))
      fail<ValueError>("executable: corrupt memory plan (%{} is output {} donated by {})", v, b.index, b.donor);
  }
  plan.arena_bytes = r.pod<uint64_t>("arena bytes");
  // The arena is allocated by this size when the executable is made, so it must follow
  // from the buffers: each arena buffer holds its value's bytes inside the arena, and the
  // arena is no larger than all of them side by side (each padded to at most
  // kMaxAlignment). A damaged size (2^40) is refused here instead of allocated.
  constexpr uint64_t kMaxAlignment = 4096;
  uint64_t side_by_side = 0;
  for (size_t v = 0; v < plan.values.size(); ++v) {
    const BufferAssignment& b = plan.values[v];
    if (b.kind != BufferAssignment::Kind::Arena) continue;
    const uint64_t value_bytes = g.values[v].dead ? 0 : g.values[v].type.nbytes();
    if (b.bytes != value_bytes || b.offset > plan.arena_bytes || b.bytes > plan.arena_bytes - b.offset)
      fail<ValueError>(
          "executable: corrupt memory plan (%{}: {} bytes at offset {} of a {}-byte arena; its type has {})", v,
          b.bytes, b.offset, plan.arena_bytes, value_bytes);
    side_by_side += b.bytes + kMaxAlignment;
  }
  if (plan.arena_bytes > side_by_side)
    fail<ValueError>("executable: corrupt memory plan (a {}-byte arena for {} bytes of buffers)", plan.arena_bytes,
                     side_by_side);
  plan.peak_bytes = r.pod<uint64_t>("peak bytes");
  plan.in_place_reuses = static_cast<int>(r.pod<uint32_t>("in-place count"));
  plan.donations = static_cast<int>(r.pod<uint32_t>("donation count"));
  // The host arena is allocated (pinned, on a GPU) by this size: the same check.
  plan.host_arena_bytes = r.pod<uint64_t>("host arena bytes");
  uint64_t host_side_by_side = 0;
  for (size_t v = 0; v < plan.values.size(); ++v) {
    const BufferAssignment& b = plan.values[v];
    if (b.kind != BufferAssignment::Kind::Host) continue;
    const uint64_t value_bytes = g.values[v].dead ? 0 : g.values[v].type.nbytes();
    if (b.bytes != value_bytes || b.offset > plan.host_arena_bytes || b.bytes > plan.host_arena_bytes - b.offset)
      fail<ValueError>(
          "executable: corrupt memory plan (host value %{}: {} bytes at offset {} of a {}-byte host arena; its type "
          "has {})",
          v, b.bytes, b.offset, plan.host_arena_bytes, value_bytes);
    host_side_by_side += b.bytes + kMaxAlignment;
  }
  if (plan.host_arena_bytes > host_side_by_side)
    fail<ValueError>("executable: corrupt memory plan (a {}-byte host arena for {} bytes of buffers)",
                     plan.host_arena_bytes, host_side_by_side);
  plan.offloaded_bytes = r.pod<uint64_t>("offloaded bytes");
  plan.offloaded_values = static_cast<int>(r.pod<uint32_t>("offloaded values"));
  return plan;
}

}  // namespace

std::string Executable::serialize() const {
  ByteWriter w;
  w.pod<uint64_t>(donated_.size());
  for (bool d : donated_) w.pod<uint8_t>(d ? 1 : 0);
  write_graph(w, graph_);
  write_plan(w, plan_);
  const std::string& body = w.bytes();
  std::string out(kMagic, sizeof kMagic);
  out.reserve(kPreambleBytes + body.size());
  const uint32_t version = kExecutableFormatVersion;
  const uint64_t length = body.size();
  const uint64_t hash = XXH3_64bits(body.data(), body.size());
  out.append(reinterpret_cast<const char*>(&version), sizeof version);
  out.append(reinterpret_cast<const char*>(&length), sizeof length);
  out.append(reinterpret_cast<const char*>(&hash), sizeof hash);
  out += body;
  return out;
}

std::unique_ptr<Executable> Executable::deserialize(std::string_view bytes) {
  if (bytes.size() < sizeof kMagic + sizeof(uint32_t) || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    fail<ValueError>("executable: not a serialized tessera executable (bad magic)");
  ByteReader preamble(bytes.substr(sizeof kMagic), "executable");
  const auto version = preamble.pod<uint32_t>("version");
  if (version != kExecutableFormatVersion)
    fail<ValueError>("executable: format version {} is not supported (this build reads version {})", version,
                     kExecutableFormatVersion);
  const auto length = preamble.pod<uint64_t>("body length");
  const auto hash = preamble.pod<uint64_t>("body hash");
  const std::string_view body = bytes.substr(kPreambleBytes);
  if (body.size() != length)
    fail<ValueError>("executable: truncated bytes: the body has {} bytes (the header says {})", body.size(), length);
  if (XXH3_64bits(body.data(), body.size()) != hash)
    fail<ValueError>("executable: corrupt bytes: the body hash does not match (damaged)");
  ByteReader r(body, "executable");
  std::vector<bool> donated(r.count("donation count", 1));
  for (size_t i = 0; i < donated.size(); ++i) donated[i] = r.pod<uint8_t>("donation flag") != 0;
  Graph graph = read_graph(r);
  if (donated.size() != graph.parameters.size())
    fail<ValueError>("executable: {} donation flags for {} parameters", donated.size(), graph.parameters.size());
  MemoryPlan plan = read_plan(r, graph);
  if (!r.done()) fail<ValueError>("executable: trailing bytes after the memory plan (corrupt)");
  try {
    return std::make_unique<Executable>(std::move(graph), std::move(plan), std::move(donated));
  } catch (const ValueError&) {
    throw;
  } catch (const Error& e) {
    // The constructor's own checks (a buffer outside the arena): damage too.
    fail<ValueError>("executable: corrupt bytes: {}", e.what());
  }
}

}  // namespace tessera::compiler
