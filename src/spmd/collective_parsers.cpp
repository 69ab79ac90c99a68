// The IR parser's factories for the collectives: a per-device SPMD program read back
// from its text or from a serialized Executable (the persistent compilation cache)
// rebuilds each collective from its attributes() ("axes=[model], dim=1,
// mesh=(data=2, model=4)"): axes by name on the printed mesh. ragged_all_to_all too
// (spmd/ragged_all_to_all.h).
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/ir/primitive_table.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/ragged_all_to_all.h"

namespace tessera::spmd {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// "(data=2, model=4)" -> the mesh.
Mesh parse_mesh(const AttributeMap& a, const std::string& op) {
  const std::string& text = a.raw("mesh");
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    fail<ValueError>("{}: attribute mesh = '{}' is not a mesh (expected e.g. (data=2, model=4))", op, text);
  return Mesh::parse(std::string_view(text).substr(1, text.size() - 2));
}

// "[data, model]" -> the axes' indices on `mesh`.
std::vector<int> parse_axes(const AttributeMap& a, const Mesh& mesh, const std::string& op) {
  const std::string& text = a.raw("axes");
  if (text.size() < 2 || text.front() != '[' || text.back() != ']')
    fail<ValueError>("{}: attribute axes = '{}' is not a list of mesh axes (expected e.g. [data])", op, text);
  std::vector<int> axes;
  std::string_view inner = trim(std::string_view(text).substr(1, text.size() - 2));
  while (!inner.empty()) {
    const size_t comma = inner.find(',');
    try {
      axes.push_back(mesh.axis_index(trim(inner.substr(0, comma))));
    } catch (const ValueError& e) {
      fail<ValueError>("{}: attribute axes: {}", op, e.what());
    }
    inner = comma == std::string_view::npos ? std::string_view() : trim(inner.substr(comma + 1));
  }
  return axes;
}

int to_dim(int64_t v, const std::string& op, const char* key) {
  if (v < 0 || v > (1 << 20)) fail<ValueError>("{}: attribute {} = {} is not a dimension", op, key, v);
  return static_cast<int>(v);
}

}  // namespace

void register_collective_parsers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (CollectiveKind kind : {CollectiveKind::AllGather, CollectiveKind::AllReduce, CollectiveKind::ReduceScatter,
                                CollectiveKind::AllToAll, CollectiveKind::ShardSlice, CollectiveKind::ShardPad}) {
      const std::string op = to_string(kind);
      check_registration(op, OpFamily::Collective, OpProvider::ParserFactory);
      compiler::register_primitive(op, [kind, op](const AttributeMap& a) -> PrimitivePtr {
        Mesh mesh = parse_mesh(a, op);
        std::vector<int> axes = parse_axes(a, mesh, op);
        int dim = -1, concat = -1;
        if (kind == CollectiveKind::AllToAll) {
          dim = to_dim(a.get_int("split"), op, "split");
          concat = to_dim(a.get_int("concat"), op, "concat");
        } else if (kind != CollectiveKind::AllReduce) {
          dim = to_dim(a.get_int("dim"), op, "dim");
        }
        return std::make_shared<Collective>(kind, std::move(mesh), std::move(axes), dim, concat);
      });
    }
    const std::string ragged = "ragged_all_to_all";
    check_registration(ragged, OpFamily::Collective, OpProvider::ParserFactory);
    compiler::register_primitive(ragged, [ragged](const AttributeMap& a) -> PrimitivePtr {
      Mesh mesh = parse_mesh(a, ragged);
      std::vector<int> axes = parse_axes(a, mesh, ragged);
      return std::make_shared<RaggedAllToAll>(a.get_bool("combine"), std::move(mesh), std::move(axes));
    });
  });
}

}  // namespace tessera::spmd
