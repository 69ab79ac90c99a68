#include "tessera/compiler/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "tessera/base/error.h"

namespace tessera::compiler {

namespace {

std::string constant_attributes(const Array& c) {
  const int64_t n = c.size();
  if (n <= 16) {
    std::vector<double> v = c.to_vector<double>();
    if (c.ndim() == 0) return fmt::format("value={}", v[0]);
    return fmt::format("value=[{}]", fmt::join(v, ", "));
  }
  return fmt::format("bytes={}, hash={:016x}", c.nbytes(), constant_fingerprint(c));
}

}  // namespace

uint64_t constant_fingerprint(const Array& data) {
  // FNV-1a over the bytes.
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data.raw_data());
  for (size_t i = 0; i < data.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string to_string(const TensorType& type) {
  return std::string(short_name(type.dtype)) + tessera::to_string(type.shape);
}

TensorType type_of(const Array& a) { return {a.shape(), a.dtype()}; }

ValueId Graph::add_parameter(TensorType type) {
  Value v;
  v.type = std::move(type);
  v.kind = ValueKind::Parameter;
  values.push_back(std::move(v));
  ValueId id = static_cast<ValueId>(values.size() - 1);
  parameters.push_back(id);
  return id;
}

ValueId Graph::add_constant(const Array& data) {
  data.eval();
  Value v;
  v.type = type_of(data);
  v.kind = ValueKind::Constant;
  v.constant = data;
  values.push_back(std::move(v));
  return static_cast<ValueId>(values.size() - 1);
}

std::vector<ValueId> Graph::add_node(PrimitivePtr primitive, std::vector<ValueId> inputs,
                                     std::vector<TensorType> types) {
  return insert_node(static_cast<int>(nodes.size()), std::move(primitive), std::move(inputs), std::move(types));
}

std::vector<ValueId> Graph::insert_node(int position, PrimitivePtr primitive, std::vector<ValueId> inputs,
                                        std::vector<TensorType> types) {
  if (position < 0 || position > static_cast<int>(nodes.size()))
    fail<ValueError>("graph: insert position {} out of range [0, {}]", position, nodes.size());
  for (ValueId in : inputs) {
    if (in < 0 || in >= static_cast<ValueId>(values.size()))
      fail<ValueError>("graph: {} reads value %{} which does not exist", primitive->name(), in);
  }
  // Nodes after the insertion point move down one place.
  if (position < static_cast<int>(nodes.size())) {
    for (Value& v : values) {
      if (v.kind == ValueKind::NodeOutput && v.node >= position) ++v.node;
    }
  }
  Node node;
  node.primitive = std::move(primitive);
  node.inputs = std::move(inputs);
  for (size_t i = 0; i < types.size(); ++i) {
    Value v;
    v.type = std::move(types[i]);
    v.kind = ValueKind::NodeOutput;
    v.node = position;
    v.output_index = static_cast<int>(i);
    values.push_back(std::move(v));
    node.outputs.push_back(static_cast<ValueId>(values.size() - 1));
  }
  std::vector<ValueId> outs = node.outputs;
  nodes.insert(nodes.begin() + position, std::move(node));
  return outs;
}

const Node* Graph::producer(ValueId v) const {
  const Value& value = values.at(static_cast<size_t>(v));
  return value.kind == ValueKind::NodeOutput ? &nodes.at(static_cast<size_t>(value.node)) : nullptr;
}

Node* Graph::producer(ValueId v) {
  const Value& value = values.at(static_cast<size_t>(v));
  return value.kind == ValueKind::NodeOutput ? &nodes.at(static_cast<size_t>(value.node)) : nullptr;
}

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> out(values.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].dead) continue;
    for (ValueId in : nodes[n].inputs) {
      auto& u = out[static_cast<size_t>(in)];
      if (u.empty() || u.back() != static_cast<int>(n)) u.push_back(static_cast<int>(n));
    }
  }
  return out;
}

size_t Graph::num_nodes() const {
  return static_cast<size_t>(std::count_if(nodes.begin(), nodes.end(), [](const Node& n) { return !n.dead; }));
}

void Graph::replace_uses(ValueId from, ValueId to) {
  if (type(from) != type(to))
    fail<ValueError>("graph: cannot replace %{} ({}) by %{} ({}): types differ", from, to_string(type(from)), to,
                     to_string(type(to)));
  for (Node& node : nodes) {
    if (node.dead) continue;
    for (ValueId& in : node.inputs) {
      if (in == from) in = to;
    }
  }
  for (ValueId& out : outputs) {
    if (out == from) out = to;
  }
}

void Graph::erase_node(int index) {
  Node& node = nodes.at(static_cast<size_t>(index));
  node.dead = true;
  for (ValueId out : node.outputs) values[static_cast<size_t>(out)].dead = true;
}

void Graph::compact() {
  // Values that are still referenced: parameters, live node outputs, constants read
  // by a live node or returned.
  std::vector<char> used(values.size(), 0);
  for (ValueId p : parameters) used[static_cast<size_t>(p)] = 1;
  for (const Node& node : nodes) {
    if (node.dead) continue;
    for (ValueId in : node.inputs) used[static_cast<size_t>(in)] = 1;
    for (ValueId out : node.outputs) used[static_cast<size_t>(out)] = 1;
  }
  for (ValueId out : outputs) used[static_cast<size_t>(out)] = 1;

  // New ids in a canonical order: parameters, constants (by old id), node outputs.
  std::vector<ValueId> remap(values.size(), kNoValue);
  std::vector<Value> new_values;
  auto take = [&](ValueId old) {
    remap[static_cast<size_t>(old)] = static_cast<ValueId>(new_values.size());
    new_values.push_back(values[static_cast<size_t>(old)]);
  };
  for (ValueId p : parameters) take(p);
  for (size_t v = 0; v < values.size(); ++v) {
    if (used[v] && values[v].kind == ValueKind::Constant && !values[v].dead) take(static_cast<ValueId>(v));
  }
  std::vector<Node> new_nodes;
  for (Node& node : nodes) {
    if (node.dead) continue;
    for (ValueId out : node.outputs) take(out);
    new_nodes.push_back(std::move(node));
  }
  for (size_t n = 0; n < new_nodes.size(); ++n) {
    Node& node = new_nodes[n];
    for (ValueId& in : node.inputs) {
      if (remap[static_cast<size_t>(in)] == kNoValue)
        fail<Error>("graph: {} reads a removed value %{}", node.primitive->name(), in);
      in = remap[static_cast<size_t>(in)];
    }
    for (ValueId& out : node.outputs) {
      out = remap[static_cast<size_t>(out)];
      new_values[static_cast<size_t>(out)].node = static_cast<int>(n);
    }
  }
  for (ValueId& p : parameters) p = remap[static_cast<size_t>(p)];
  for (ValueId& out : outputs) {
    if (remap[static_cast<size_t>(out)] == kNoValue) fail<Error>("graph: an output reads a removed value %{}", out);
    out = remap[static_cast<size_t>(out)];
  }
  values = std::move(new_values);
  nodes = std::move(new_nodes);
}

void Graph::verify() const {
  std::vector<char> defined(values.size(), 0);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Value& v = value(parameters[i]);
    if (v.kind != ValueKind::Parameter) fail<Error>("graph verify: parameter {} is not a parameter value", i);
    defined[static_cast<size_t>(parameters[i])] = 1;
  }
  for (size_t v = 0; v < values.size(); ++v) {
    if (values[v].kind == ValueKind::Constant && !values[v].dead) {
      if (!values[v].constant.valid() || values[v].constant.shape() != values[v].type.shape ||
          values[v].constant.dtype() != values[v].type.dtype)
        fail<Error>("graph verify: constant %{} has no data of type {}", v, to_string(values[v].type));
      defined[v] = 1;
    }
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    if (node.dead) continue;
    if (!node.primitive) fail<Error>("graph verify: node {} has no primitive", n);
    for (ValueId in : node.inputs) {
      if (in < 0 || in >= static_cast<ValueId>(values.size()) || !defined[static_cast<size_t>(in)])
        fail<Error>("graph verify: node {} ({}) reads %{} before it is defined", n, node.primitive->name(), in);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      ValueId out = node.outputs[i];
      const Value& v = value(out);
      if (v.kind != ValueKind::NodeOutput || v.node != static_cast<int>(n) || v.output_index != static_cast<int>(i))
        fail<Error>("graph verify: output {} of node {} ({}) is not linked back to it", i, n, node.primitive->name());
      if (defined[static_cast<size_t>(out)]) fail<Error>("graph verify: %{} is defined twice", out);
      defined[static_cast<size_t>(out)] = 1;
    }
    if (node.remat_region >= static_cast<int>(remat_regions.size()))
      fail<Error>("graph verify: node {} names remat region {} of {}", n, node.remat_region, remat_regions.size());
  }
  for (ValueId out : outputs) {
    if (out < 0 || out >= static_cast<ValueId>(values.size()) || !defined[static_cast<size_t>(out)])
      fail<Error>("graph verify: output %{} is not defined", out);
  }
}

std::string Graph::text() const {
  std::unordered_map<ValueId, int> names;
  int next = 0;
  auto name_of = [&](ValueId v) {
    auto it = names.find(v);
    return it == names.end() ? fmt::format("%?{}", v) : fmt::format("%{}", it->second);
  };
  std::ostringstream os;
  os << "func @" << name << "(";
  for (size_t i = 0; i < parameters.size(); ++i) {
    names[parameters[i]] = next;
    os << (i ? ", " : "") << "%" << next++ << ": " << to_string(type(parameters[i]));
  }
  os << ") -> (";
  for (size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << to_string(type(outputs[i]));
  os << ") {\n";
  // Constants in the order the nodes first read them, then any returned directly.
  auto print_constant = [&](ValueId v) {
    if (names.count(v)) return;
    names[v] = next;
    os << "  %" << next++ << " = constant {" << constant_attributes(value(v).constant) << "} : " << to_string(type(v))
       << "\n";
  };
  for (const Node& node : nodes) {
    if (node.dead) continue;
    for (ValueId in : node.inputs) {
      if (value(in).kind == ValueKind::Constant) print_constant(in);
    }
  }
  for (ValueId out : outputs) {
    if (value(out).kind == ValueKind::Constant) print_constant(out);
  }
  for (const Node& node : nodes) {
    if (node.dead) continue;
    os << "  ";
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      names[node.outputs[i]] = next;
      os << (i ? ", %" : "%") << next++;
    }
    os << " = " << node.primitive->name() << "(";
    for (size_t i = 0; i < node.inputs.size(); ++i) os << (i ? ", " : "") << name_of(node.inputs[i]);
    os << ")";
    std::string attrs = node.primitive->attributes();
    if (!attrs.empty()) os << " {" << attrs << "}";
    os << " : ";
    for (size_t i = 0; i < node.outputs.size(); ++i) os << (i ? ", " : "") << to_string(type(node.outputs[i]));
    if (node.remat_region >= 0 || !node.remat_name.empty()) {
      os << "  #remat";
      if (node.remat_region >= 0) os << " region=" << node.remat_region;
      if (!node.remat_name.empty()) os << " name=" << node.remat_name;
    }
    os << "\n";
  }
  os << "  return";
  for (size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : " ") << name_of(outputs[i]);
  os << "\n}\n";
  return os.str();
}

}  // namespace tessera::compiler
