// The custom-op registry, the op function users call and the attribute text a custom
// op prints in the IR (and reads back from the compilation cache).
#include "tessera/core/custom_op.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/custom_op_primitive.h"
#include "tessera/ir/primitive_table.h"

namespace tessera {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const CustomOpDefinition>> ops;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: kernels may run during exit
  return *r;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

// The IR's own words, which no op may take.
const std::set<std::string>& reserved_names() {
  static const std::set<std::string> names = {"constant", "parameter", "output"};
  return names;
}

void check_definition(const CustomOpDefinition& d) {
  if (!is_identifier(d.name))
    fail<ValueError>("register_custom_op: name '{}' is not valid (expected a letter, then letters, digits or '_')",
                     d.name);
  if (find_primitive_entry(d.name) != nullptr || reserved_names().count(d.name) > 0)
    fail<ValueError>("register_custom_op '{}': the name is a built-in primitive's (choose another, e.g. 'my_{}')",
                     d.name, d.name);
  if (d.num_inputs < 0)
    fail<ValueError>("register_custom_op '{}': num_inputs {} (expected >= 0)", d.name, d.num_inputs);
  if (!d.input_dtypes.empty() && static_cast<int>(d.input_dtypes.size()) != d.num_inputs)
    fail<ValueError>("register_custom_op '{}': {} input_dtypes for {} inputs (expected one per input, or none)", d.name,
                     d.input_dtypes.size(), d.num_inputs);
  if (!d.infer) fail<ValueError>("register_custom_op '{}': no infer function (it gives the output shapes)", d.name);
  if (!d.cpu_kernel)
    fail<ValueError>("register_custom_op '{}': no cpu_kernel (every op needs one; CUDA source is optional)", d.name);
  if (d.cuda) {
    if (d.cuda->source.empty() || d.cuda->kernel_name.empty() || !d.cuda->launch)
      fail<ValueError>("register_custom_op '{}': cuda needs source, kernel_name and launch (got {}, '{}', {})", d.name,
                       d.cuda->source.empty() ? "no source" : "source", d.cuda->kernel_name,
                       d.cuda->launch ? "a launch function" : "no launch function");
  }
  if (!d.sharding.is_unsharded_only()) {
    const std::string& spec = d.sharding.spec;
    size_t arrow = spec.find("->");
    if (arrow == std::string::npos)
      fail<ValueError>("register_custom_op '{}': sharding spec '{}' has no '->' (expected \"b t d, b t d -> b t d\")",
                       d.name, spec);
    auto ins = custom_op_factor_groups(d.name, spec.substr(0, arrow));
    if (static_cast<int>(ins.size()) != d.num_inputs)
      fail<ValueError>("register_custom_op '{}': sharding spec '{}' describes {} inputs (expected {})", d.name, spec,
                       ins.size(), d.num_inputs);
    std::set<std::string> named;
    for (const auto& group : ins) named.insert(group.begin(), group.end());
    for (const auto& group : custom_op_factor_groups(d.name, spec.substr(arrow + 2)))
      named.insert(group.begin(), group.end());
    for (const std::string& f : d.sharding.shardable)
      if (named.count(f) == 0)
        fail<ValueError>("register_custom_op '{}': shardable factor '{}' does not appear in the spec '{}'", d.name, f,
                         spec);
  }
}

void check_text_safe(const std::string& op, const std::string& key, const std::string& value) {
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || std::string_view(",()[]{}\"\\").find(c) != std::string_view::npos)
      fail<ValueError>(
          "custom op '{}': attribute '{}' = \"{}\" contains '{}' (strings may not hold , ( ) [ ] {{ }} \" \\ or "
          "control characters)",
          op, key, value, c);
  }
}

}  // namespace

// Splits "a b, c d" into per-operand factor lists; checks every factor is an
// identifier or "_".
std::vector<std::vector<std::string>> custom_op_factor_groups(const std::string& op, const std::string& text) {
  std::vector<std::vector<std::string>> groups(1);
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    if (word != "_" && !is_identifier(word))
      fail<ValueError>("register_custom_op '{}': sharding factor '{}' is not a name (expected letters, digits, '_')",
                       op, word);
    groups.back().push_back(word);
    word.clear();
  };
  for (char c : text) {
    if (c == ',') {
      flush();
      groups.emplace_back();
    } else if (c == ' ' || c == '\t') {
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
  return groups;
}

int64_t attribute_int(const CustomAttributes& attributes, const std::string& key, const std::string& op) {
  auto it = attributes.find(key);
  if (it == attributes.end()) fail<ValueError>("custom op '{}': missing int attribute '{}'", op, key);
  if (const auto* v = std::get_if<int64_t>(&it->second)) return *v;
  fail<ValueError>("custom op '{}': attribute '{}' is not an int", op, key);
}

double attribute_double(const CustomAttributes& attributes, const std::string& key, const std::string& op) {
  auto it = attributes.find(key);
  if (it == attributes.end()) fail<ValueError>("custom op '{}': missing double attribute '{}'", op, key);
  if (const auto* v = std::get_if<double>(&it->second)) return *v;
  if (const auto* v = std::get_if<int64_t>(&it->second)) return static_cast<double>(*v);
  fail<ValueError>("custom op '{}': attribute '{}' is a string (expected a number)", op, key);
}

const std::string& attribute_string(const CustomAttributes& attributes, const std::string& key, const std::string& op) {
  auto it = attributes.find(key);
  if (it == attributes.end()) fail<ValueError>("custom op '{}': missing string attribute '{}'", op, key);
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  fail<ValueError>("custom op '{}': attribute '{}' is a number (expected a string)", op, key);
}

std::string print_custom_attributes(const std::string& op, const CustomAttributes& attributes) {
  std::string out;
  for (const auto& [key, value] : attributes) {
    if (!is_identifier(key))
      fail<ValueError>("custom op '{}': attribute key '{}' is not valid (expected a letter, then letters, digits, '_')",
                       op, key);
    if (!out.empty()) out += ", ";
    out += key + "=";
    if (const auto* i = std::get_if<int64_t>(&value)) {
      out += std::to_string(*i);
    } else if (const auto* d = std::get_if<double>(&value)) {
      // Shortest text that reads back to the same double; a '.0' keeps "2" a double.
      std::string t = fmt::format("{}", *d);
      if (t.find_first_of(".eni") == std::string::npos) t += ".0";
      out += t;
    } else {
      const std::string& s = std::get<std::string>(value);
      check_text_safe(op, key, s);
      out += "\"" + s + "\"";
    }
  }
  return out;
}

CustomAttributes parse_custom_attributes(const std::string& op, const std::string& text) {
  CustomAttributes out;
  size_t begin = 0;
  auto trim = [](std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    return s;
  };
  if (trim(text).empty()) return out;
  while (begin <= text.size()) {
    size_t comma = text.find(',', begin);
    std::string part = trim(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    begin = comma == std::string::npos ? text.size() + 1 : comma + 1;
    size_t eq = part.find('=');
    if (eq == std::string::npos) fail<ValueError>("custom op '{}': attribute '{}' is not key=value", op, part);
    std::string key = trim(part.substr(0, eq));
    std::string value = trim(part.substr(eq + 1));
    if (!is_identifier(key)) fail<ValueError>("custom op '{}': attribute key '{}' is not valid", op, key);
    CustomAttribute parsed;
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      parsed = value.substr(1, value.size() - 2);
    } else {
      int64_t i = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), i);
      if (ec == std::errc() && end == value.data() + value.size() && !value.empty()) {
        parsed = i;
      } else {
        errno = 0;
        char* stop = nullptr;
        double d = std::strtod(value.c_str(), &stop);
        if (value.empty() || stop != value.c_str() + value.size())
          fail<ValueError>("custom op '{}': attribute '{}' = '{}' is neither a number nor a quoted string", op, key,
                           value);
        parsed = d;
      }
    }
    if (!out.emplace(key, std::move(parsed)).second)
      fail<ValueError>("custom op '{}': attribute '{}' given twice", op, key);
  }
  return out;
}

std::vector<TensorSpec> specs_of(const std::vector<Array>& arrays) {
  std::vector<TensorSpec> specs;
  specs.reserve(arrays.size());
  for (const Array& a : arrays) specs.push_back({a.shape(), a.dtype()});
  return specs;
}

void register_custom_op(CustomOpDefinition definition) {
  check_definition(definition);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name = definition.name;
  if (r.ops.count(name) > 0)
    fail<ValueError>("register_custom_op '{}': a custom op of that name is already registered", name);
  r.ops.emplace(name, std::make_shared<const CustomOpDefinition>(std::move(definition)));
}

bool unregister_custom_op(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.ops.erase(name) > 0;
}

std::shared_ptr<const CustomOpDefinition> find_custom_op(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.ops.find(name);
  return it == r.ops.end() ? nullptr : it->second;
}

std::vector<Array> custom_op(const std::string& name, const std::vector<Array>& inputs,
                             const CustomAttributes& attributes) {
  std::shared_ptr<const CustomOpDefinition> def = find_custom_op(name);
  if (!def) fail<ValueError>("custom_op: no custom op named '{}' is registered (call register_custom_op first)", name);
  return apply_custom_op(def, inputs, attributes);
}

std::vector<Array> apply_custom_op(const std::shared_ptr<const CustomOpDefinition>& def,
                                   const std::vector<Array>& inputs, const CustomAttributes& attributes) {
  const std::string& name = def->name;
  if (static_cast<int>(inputs.size()) != def->num_inputs)
    fail<ValueError>("custom op '{}': called with {} inputs (expected {})", name, inputs.size(), def->num_inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].valid()) fail<ValueError>("custom op '{}': input {} is an invalid Array", name, i);
    if (!def->input_dtypes.empty() && inputs[i].dtype() != def->input_dtypes[i])
      fail<DTypeError>("custom op '{}': input {} is {} (expected {})", name, i, type_string(inputs[i]),
                       tessera::name(def->input_dtypes[i]));
  }
  auto primitive = std::make_shared<CustomOp>(def, attributes);
  std::vector<TensorSpec> outs = def->infer(specs_of(inputs), attributes);
  if (outs.empty()) fail<ValueError>("custom op '{}': infer returned no outputs (expected at least one)", name);
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const TensorSpec& s : outs) {
    for (int64_t d : s.shape)
      if (d < 0)
        fail<ShapeError>("custom op '{}': infer gave output shape {} (negative dim)", name, to_string(s.shape));
    shapes.push_back(s.shape);
    dtypes.push_back(s.dtype);
  }
  return Array::make(std::move(shapes), std::move(dtypes), std::move(primitive), inputs);
}

PrimitivePtr make_custom_primitive(std::shared_ptr<const CustomOpDefinition> definition,
                                   const std::string& attributes_text) {
  CustomAttributes attributes = parse_custom_attributes(definition->name, attributes_text);
  return std::make_shared<CustomOp>(std::move(definition), std::move(attributes));
}

const CustomOpDefinition* custom_op_definition(const Primitive& primitive) {
  const auto* p = dynamic_cast<const CustomOp*>(&primitive);
  return p ? &p->definition() : nullptr;
}

const CustomAttributes* custom_op_attributes(const Primitive& primitive) {
  const auto* p = dynamic_cast<const CustomOp*>(&primitive);
  return p ? &p->values() : nullptr;
}

CustomOp::CustomOp(std::shared_ptr<const CustomOpDefinition> definition, CustomAttributes attributes)
    : definition_(std::move(definition)),
      attributes_(std::move(attributes)),
      text_(print_custom_attributes(definition_->name, attributes_)) {}

}  // namespace tessera
