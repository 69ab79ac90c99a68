// The table from IR op names to primitive factories, and the attribute reader they
// share. Each factory reads back exactly what the primitive's attributes() prints
// (src/core/primitives/*.cpp), so make_primitive(p->name(), p->attributes()) rebuilds p.
#include "tessera/compiler/primitive_registry.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string_view>
#include <utility>

#include "tessera/base/error.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/fusion.h"
#include "tessera/ir/primitives/indexing.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/matmul_epilogue.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/ir/primitives/optim.h"
#include "tessera/ir/primitives/random.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::compiler {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Attribute text may span lines in hand-written IR.
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Splits at commas outside brackets, braces and parentheses; throws on unbalanced text.
std::vector<std::string_view> split_top_level(std::string_view text, const std::string& op) {
  std::vector<std::string_view> parts;
  std::string closers;  // expected closing characters, innermost last
  size_t begin = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '[' || c == '{' || c == '(') {
      closers.push_back(c == '[' ? ']' : c == '{' ? '}' : ')');
    } else if (c == ']' || c == '}' || c == ')') {
      if (closers.empty() || closers.back() != c) {
        fail<ValueError>("{}: unbalanced '{}' at column {} of attributes '{}'", op, c, i + 1, text);
      }
      closers.pop_back();
    } else if (c == ',' && closers.empty()) {
      parts.push_back(trim(text.substr(begin, i - begin)));
      begin = i + 1;
    }
  }
  if (!closers.empty()) fail<ValueError>("{}: missing '{}' in attributes '{}'", op, closers.back(), text);
  parts.push_back(trim(text.substr(begin)));
  return parts;
}

bool parse_int64(std::string_view s, int64_t& out) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

int to_int(int64_t v, const std::string& op, const char* key) {
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    fail<ValueError>("{}: attribute '{}' = {} does not fit an int", op, key, v);
  }
  return static_cast<int>(v);
}

std::vector<int> to_ints(const std::vector<int64_t>& values, const std::string& op, const char* key) {
  std::vector<int> out;
  out.reserve(values.size());
  for (int64_t v : values) out.push_back(to_int(v, op, key));
  return out;
}

Shape checked_shape(const AttributeMap& a, const std::string& op, const char* key) {
  Shape shape = a.get_shape(key);
  for (int64_t d : shape) {
    if (d < 0) fail<ValueError>("{}: attribute '{}' = {} has a negative dimension", op, key, to_string(shape));
  }
  return shape;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, PrimitiveFactory> factories;
};

template <typename P>
PrimitiveFactory plain() {
  return [](const AttributeMap&) -> PrimitivePtr { return std::make_shared<P>(); };
}

void register_builtins(std::map<std::string, PrimitiveFactory>& f) {
  // ---- elementwise ----
  for (int k = 0; k <= static_cast<int>(UnaryKind::Copy); ++k) {
    auto kind = static_cast<UnaryKind>(k);
    f[unary_name(kind)] = [kind](const AttributeMap&) -> PrimitivePtr { return std::make_shared<Unary>(kind); };
  }
  for (int k = 0; k <= static_cast<int>(BinaryKind::TanhGrad); ++k) {
    auto kind = static_cast<BinaryKind>(k);
    f[binary_name(kind)] = [kind](const AttributeMap&) -> PrimitivePtr { return std::make_shared<Binary>(kind); };
  }
  f["where"] = plain<Where>();
  f["fusion"] = [](const AttributeMap& a) { return parse_fusion(a); };
  f["stop_gradient"] = plain<StopGradient>();
  f["identity"] = plain<Identity>();
  f["convert"] = [](const AttributeMap& a) -> PrimitivePtr { return std::make_shared<Cast>(a.get_dtype("dtype")); };

  // ---- layout ----
  f["reshape"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Reshape>(checked_shape(a, "reshape", "shape"));
  };
  f["transpose"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Transpose>(to_ints(a.get_ints("perm"), "transpose", "perm"));
  };
  f["broadcast_to"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<BroadcastTo>(checked_shape(a, "broadcast_to", "shape"));
  };
  f["slice"] = [](const AttributeMap& a) -> PrimitivePtr {
    auto start = a.get_ints("start"), stop = a.get_ints("stop"), step = a.get_ints("step");
    if (stop.size() != start.size() || step.size() != start.size()) {
      fail<ValueError>("slice: attributes start, stop and step have different lengths ({}, {}, {})", start.size(),
                       stop.size(), step.size());
    }
    return std::make_shared<Slice>(std::move(start), std::move(stop), std::move(step));
  };
  f["slice_pad"] = [](const AttributeMap& a) -> PrimitivePtr {
    Shape shape = checked_shape(a, "slice_pad", "shape");
    auto start = a.get_ints("start"), step = a.get_ints("step");
    if (start.size() != shape.size() || step.size() != shape.size()) {
      fail<ValueError>("slice_pad: attributes shape, start and step have different lengths ({}, {}, {})", shape.size(),
                       start.size(), step.size());
    }
    return std::make_shared<SlicePad>(std::move(shape), std::move(start), std::move(step));
  };
  f["concatenate"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Concatenate>(to_int(a.get_int("axis"), "concatenate", "axis"));
  };

  // ---- linalg ----
  // Matmul prints nothing when neither operand is transposed.
  f["matmul"] = [](const AttributeMap& a) -> PrimitivePtr {
    bool trans_a = a.has("trans_a") && a.get_bool("trans_a");
    bool trans_b = a.has("trans_b") && a.get_bool("trans_b");
    return std::make_shared<Matmul>(trans_a, trans_b);
  };
  f["matmul_epilogue"] = [](const AttributeMap& a) { return parse_matmul_epilogue(a); };

  // ---- reductions ----
  const std::pair<const char*, ReduceKind> reductions[] = {{"reduce_sum", ReduceKind::Sum},
                                                           {"reduce_prod", ReduceKind::Prod},
                                                           {"reduce_max", ReduceKind::Max},
                                                           {"reduce_min", ReduceKind::Min}};
  for (const auto& [name, kind] : reductions) {
    std::string op = name;
    ReduceKind k = kind;
    f[op] = [op, k](const AttributeMap& a) -> PrimitivePtr {
      return std::make_shared<Reduce>(k, to_ints(a.get_ints("axes"), op, "axes"));
    };
  }
  for (bool is_max : {true, false}) {
    std::string op = is_max ? "argmax" : "argmin";
    f[op] = [op, is_max](const AttributeMap& a) -> PrimitivePtr {
      return std::make_shared<ArgReduce>(is_max, to_int(a.get_int("axis"), op, "axis"));
    };
  }

  // ---- indexing ----
  f["take"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Take>(to_int(a.get_int("axis"), "take", "axis"));
  };
  f["take_along_axis"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<TakeAlong>(to_int(a.get_int("axis"), "take_along_axis", "axis"));
  };
  f["scatter_add"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<TakeScatterAdd>(checked_shape(a, "scatter_add", "shape"),
                                            to_int(a.get_int("axis"), "scatter_add", "axis"));
  };
  f["scatter_add_along_axis"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<TakeAlongScatterAdd>(checked_shape(a, "scatter_add_along_axis", "shape"),
                                                 to_int(a.get_int("axis"), "scatter_add_along_axis", "axis"));
  };

  // ---- nn ----
  for (bool log : {false, true}) {
    f[log ? "log_softmax" : "softmax"] = [log](const AttributeMap&) -> PrimitivePtr {
      return std::make_shared<Softmax>(log);
    };
    f[log ? "log_softmax_grad" : "softmax_grad"] = [log](const AttributeMap&) -> PrimitivePtr {
      return std::make_shared<SoftmaxGrad>(log);
    };
  }
  for (bool rms : {false, true}) {
    f[rms ? "rms_norm" : "layer_norm"] = [rms](const AttributeMap& a) -> PrimitivePtr {
      return std::make_shared<Norm>(rms, a.get_bool("weight"), a.get_bool("bias"), a.get_double("eps"));
    };
    f[rms ? "rms_norm_grad" : "layer_norm_grad"] = [rms](const AttributeMap& a) -> PrimitivePtr {
      return std::make_shared<NormGrad>(rms, a.get_bool("weight"), a.get_bool("bias"));
    };
  }
  auto attention_config = [](const AttributeMap& a) {
    AttentionConfig config;
    config.causal = a.get_bool("causal");
    config.scale = a.get_double("scale");
    config.has_mask = a.get_bool("mask");
    return config;
  };
  f["attention"] = [attention_config](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Attention>(attention_config(a));
  };
  f["attention_grad"] = [attention_config](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<AttentionGrad>(attention_config(a));
  };
  f["cross_entropy"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<CrossEntropy>(a.get_int("ignore_index"));
  };
  f["cross_entropy_grad"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<CrossEntropyGrad>(a.get_int("ignore_index"));
  };

  // ---- optim ----
  f["adamw_update"] = [](const AttributeMap& a) -> PrimitivePtr {
    AdamWConfig config;
    const bool dynamic = a.has("dynamic") && a.get_bool("dynamic");
    if (!dynamic) {
      config.lr = a.get_double("lr");
      config.step = a.get_int("step");
    }
    config.beta1 = a.get_double("beta1");
    config.beta2 = a.get_double("beta2");
    config.eps = a.get_double("eps");
    config.weight_decay = a.get_double("weight_decay");
    return std::make_shared<AdamW>(config, dynamic);
  };

  // ---- random ----
  f["random_split"] = [](const AttributeMap& a) -> PrimitivePtr {
    int64_t num = a.get_int("num");
    if (num < 0) fail<ValueError>("random_split: attribute 'num' = {} is negative", num);
    return std::make_shared<RandomSplit>(num);
  };
  f["random_uniform"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<RandomSample>(Distribution::Uniform, a.get_double("low"), a.get_double("high"),
                                          checked_shape(a, "random_uniform", "shape"), a.get_dtype("dtype"));
  };
  f["random_normal"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<RandomSample>(Distribution::Normal, a.get_double("mean"), a.get_double("stddev"),
                                          checked_shape(a, "random_normal", "shape"), a.get_dtype("dtype"));
  };
  f["random_bernoulli"] = plain<RandomBernoulli>();
}

Registry& registry() {
  static Registry* instance = [] {
    auto* r = new Registry;
    register_builtins(r->factories);
    return r;
  }();
  return *instance;
}

}  // namespace

AttributeMap::AttributeMap(std::string op, const std::string& text) : op_(std::move(op)), text_(text) {
  if (trim(text).empty()) return;
  for (std::string_view part : split_top_level(text, op_)) {
    size_t eq = part.find('=');
    if (eq == std::string_view::npos || trim(part.substr(0, eq)).empty()) {
      fail<ValueError>("{}: attribute '{}' is not key=value (in '{}')", op_, part, text_);
    }
    std::string key(trim(part.substr(0, eq)));
    if (!values_.emplace(key, std::string(trim(part.substr(eq + 1)))).second) {
      fail<ValueError>("{}: attribute '{}' given twice (in '{}')", op_, key, text_);
    }
  }
}

const std::string& AttributeMap::raw(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) fail<ValueError>("{}: missing attribute '{}' (in '{}')", op_, key, text_);
  read_.insert(key);
  return it->second;
}

int64_t AttributeMap::get_int(const std::string& key) const {
  const std::string& v = raw(key);
  int64_t out = 0;
  if (!parse_int64(v, out)) fail<ValueError>("{}: attribute '{}' = '{}' is not an integer", op_, key, v);
  return out;
}

double AttributeMap::get_double(const std::string& key) const {
  const std::string& v = raw(key);
  // strtod reads fmt's shortest round-trip spelling (and inf / nan) back exactly.
  const char* begin = v.c_str();
  char* end = nullptr;
  errno = 0;
  double out = std::strtod(begin, &end);
  bool overflow = errno == ERANGE &&
                  (out == std::numeric_limits<double>::infinity() || out == -std::numeric_limits<double>::infinity());
  if (v.empty() || end != begin + v.size() || overflow) {
    fail<ValueError>("{}: attribute '{}' = '{}' is not a number", op_, key, v);
  }
  return out;
}

bool AttributeMap::get_bool(const std::string& key) const {
  const std::string& v = raw(key);
  if (v == "true") return true;
  if (v == "false") return false;
  fail<ValueError>("{}: attribute '{}' = '{}' is not a bool (expected true or false)", op_, key, v);
}

DType AttributeMap::get_dtype(const std::string& key) const {
  const std::string& v = raw(key);
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    if (v == name(dtype)) return dtype;
  }
  fail<ValueError>("{}: attribute '{}' = '{}' is not a dtype (expected e.g. float32)", op_, key, v);
}

std::vector<int64_t> AttributeMap::get_ints(const std::string& key) const {
  const std::string& v = raw(key);
  std::string_view s = v;
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') {
    fail<ValueError>("{}: attribute '{}' = '{}' is not a list (expected [1, 2, ...])", op_, key, v);
  }
  std::vector<int64_t> out;
  std::string_view inner = trim(s.substr(1, s.size() - 2));
  if (inner.empty()) return out;
  size_t begin = 0;
  while (true) {
    size_t comma = inner.find(',', begin);
    std::string_view item =
        inner.substr(begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    int64_t x = 0;
    if (!parse_int64(item, x)) {
      fail<ValueError>("{}: attribute '{}' = '{}' has a non-integer element '{}'", op_, key, v, trim(item));
    }
    out.push_back(x);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return out;
}

void AttributeMap::check_all_read() const {
  for (const auto& [key, value] : values_) {
    if (!read_.count(key)) fail<ValueError>("{}: unknown attribute '{}={}' (in '{}')", op_, key, value, text_);
  }
}

PrimitivePtr make_primitive(const std::string& name, const std::string& attributes) {
  PrimitiveFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it == r.factories.end()) {
      fail<ValueError>("make_primitive: unknown op '{}' (attributes '{}'; no factory registered)", name, attributes);
    }
    factory = it->second;
  }
  AttributeMap map(name, attributes);
  PrimitivePtr primitive = factory(map);
  map.check_all_read();
  return primitive;
}

void register_primitive(const std::string& name, PrimitiveFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

}  // namespace tessera::compiler
