// The table from IR op names to primitive factories (the attribute reader they
// share is ir/attributes.h). Each factory reads back exactly what the primitive's attributes() prints
// (src/core/primitives/*.cpp), so make_primitive(p->name(), p->attributes()) rebuilds p.
#include "tessera/compiler/primitive_registry.h"

#include <map>
#include <mutex>
#include <utility>

#include "tessera/base/error.h"
#include "tessera/core/array.h"
#include "tessera/core/custom_op.h"
#include "tessera/ir/primitive_table.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/ir/primitives/expert_dispatch.h"
#include "tessera/ir/primitives/fusion.h"
#include "tessera/ir/primitives/grouped_matmul.h"
#include "tessera/ir/primitives/indexing.h"
#include "tessera/ir/primitives/layout.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/matmul_epilogue.h"
#include "tessera/ir/primitives/nn.h"
#include "tessera/ir/primitives/optim.h"
#include "tessera/ir/primitives/quantized.h"
#include "tessera/ir/primitives/random.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::compiler {
namespace {

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

void register_elementwise(std::map<std::string, PrimitiveFactory>& f) {
  for (int k = 0; k < kNumUnaryKinds; ++k) {
    auto kind = static_cast<UnaryKind>(k);
    f[unary_name(kind)] = [kind](const AttributeMap&) -> PrimitivePtr { return std::make_shared<Unary>(kind); };
  }
  for (int k = 0; k < kNumBinaryKinds; ++k) {
    auto kind = static_cast<BinaryKind>(k);
    f[binary_name(kind)] = [kind](const AttributeMap&) -> PrimitivePtr { return std::make_shared<Binary>(kind); };
  }
  f["where"] = plain<Where>();
  f["fusion"] = [](const AttributeMap& a) { return parse_fusion(a); };
  f["stop_gradient"] = plain<StopGradient>();
  f["identity"] = plain<Identity>();
  f["convert"] = [](const AttributeMap& a) -> PrimitivePtr { return std::make_shared<Cast>(a.get_dtype("dtype")); };
}

void register_layout(std::map<std::string, PrimitiveFactory>& f) {
  f["offload_to_host"] = plain<OffloadToHost>();
  f["load_from_host"] = plain<LoadFromHost>();
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
}

void register_linalg(std::map<std::string, PrimitiveFactory>& f) {
  // Matmul prints nothing when neither operand is transposed.
  f["matmul"] = [](const AttributeMap& a) -> PrimitivePtr {
    bool trans_a = a.has("trans_a") && a.get_bool("trans_a");
    bool trans_b = a.has("trans_b") && a.get_bool("trans_b");
    return std::make_shared<Matmul>(trans_a, trans_b);
  };
  f["matmul_epilogue"] = [](const AttributeMap& a) { return parse_matmul_epilogue(a); };
  f["grouped_matmul"] = [](const AttributeMap& a) -> PrimitivePtr {
    const int64_t row_shards = a.has("row_shards") ? a.get_int("row_shards") : 1;
    if (row_shards < 1) fail<ValueError>("grouped_matmul: row_shards={} (expected >= 1)", row_shards);
    return std::make_shared<GroupedMatmul>(a.has("trans_w") && a.get_bool("trans_w"), row_shards);
  };
  f["grouped_matmul_weight_grad"] = [](const AttributeMap& a) -> PrimitivePtr {
    const int64_t groups = a.get_int("groups");
    if (groups < 1) fail<ValueError>("grouped_matmul_weight_grad: groups={} (expected >= 1)", groups);
    const int64_t row_shards = a.has("row_shards") ? a.get_int("row_shards") : 1;
    if (row_shards < 1) fail<ValueError>("grouped_matmul_weight_grad: row_shards={} (expected >= 1)", row_shards);
    return std::make_shared<GroupedMatmulWeightGrad>(groups, a.has("trans_out") && a.get_bool("trans_out"), row_shards);
  };
  f["quantized_matmul"] = [](const AttributeMap& a) -> PrimitivePtr {
    QuantizedMatmulConfig c;
    c.trans_a = a.get_bool("trans_a");
    c.trans_b = a.get_bool("trans_b");
    c.stochastic_a = a.get_bool("stochastic_a");
    c.stochastic_b = a.get_bool("stochastic_b");
    c.int8_backward = a.get_bool("int8_backward");
    const int64_t salt = a.get_int("salt");
    if (salt < 0 || salt > 0xffffffffll) fail<ValueError>("quantized_matmul: salt {} (expected a uint32)", salt);
    c.salt = static_cast<uint32_t>(salt);
    return std::make_shared<QuantizedMatmul>(c);
  };
}

void register_reduce(std::map<std::string, PrimitiveFactory>& f) {
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
}

void register_indexing(std::map<std::string, PrimitiveFactory>& f) {
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
  for (const bool combine : {false, true}) {
    const std::string op = combine ? "expert_combine" : "expert_dispatch";
    f[op] = [combine, op](const AttributeMap& a) -> PrimitivePtr {
      const int64_t shards = a.get_int("shards");
      if (shards < 1) fail<ValueError>("{}: shards={} (expected >= 1)", op, shards);
      return std::make_shared<ExpertDispatch>(combine, shards, parse_axis_list(a.raw("axes"), op));
    };
  }
  f["scatter_add_along_axis"] = [](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<TakeAlongScatterAdd>(checked_shape(a, "scatter_add_along_axis", "shape"),
                                                 to_int(a.get_int("axis"), "scatter_add_along_axis", "axis"));
  };
}

void register_nn(std::map<std::string, PrimitiveFactory>& f) {
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
  // "classes" is written only when the vocabulary is padded (CrossEntropy::attributes).
  auto classes = [](const AttributeMap& a) { return a.has("classes") ? a.get_int("classes") : int64_t{0}; };
  f["cross_entropy"] = [classes](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<CrossEntropy>(a.get_int("ignore_index"), classes(a));
  };
  f["cross_entropy_grad"] = [classes](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<CrossEntropyGrad>(a.get_int("ignore_index"), classes(a));
  };
  f["cross_entropy_with_grad"] = [classes](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<CrossEntropyWithGrad>(a.get_int("ignore_index"), classes(a));
  };
}

void register_attention(std::map<std::string, PrimitiveFactory>& f) {
  auto attention_config = [](const AttributeMap& a) {
    AttentionConfig config;
    config.causal = a.get_bool("causal");
    config.scale = a.get_double("scale");
    config.has_mask = a.get_bool("mask");
    config.has_segments = a.has("segments") && a.get_bool("segments");
    return config;
  };
  f["attention"] = [attention_config](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<Attention>(attention_config(a));
  };
  f["attention_grad"] = [attention_config](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<AttentionGrad>(attention_config(a));
  };
  f["attention_packed"] = [attention_config](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<AttentionPacked>(attention_config(a));
  };
  f["attention_packed_grad"] = [attention_config](const AttributeMap& a) -> PrimitivePtr {
    return std::make_shared<AttentionPackedGrad>(attention_config(a));
  };
}

void register_optim(std::map<std::string, PrimitiveFactory>& f) {
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
    const bool scaled_grad = a.has("scaled_grad") && a.get_bool("scaled_grad");
    return std::make_shared<AdamW>(config, dynamic, scaled_grad);
  };
  f["lion_update"] = [](const AttributeMap& a) -> PrimitivePtr {
    LionConfig config;
    const bool dynamic = a.has("dynamic") && a.get_bool("dynamic");
    if (!dynamic) config.lr = a.get_double("lr");
    config.beta1 = a.get_double("beta1");
    config.beta2 = a.get_double("beta2");
    config.weight_decay = a.get_double("weight_decay");
    return std::make_shared<Lion>(config, dynamic);
  };
}

void register_random(std::map<std::string, PrimitiveFactory>& f) {
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

// Each family's factories, checked against the primitive table (ir/primitive_table.h)
// as they are added: a name the table does not list, or lists in another family, is
// an Error here rather than a parser that silently knows more than the table.
void register_builtins(std::map<std::string, PrimitiveFactory>& f) {
  using Register = void (*)(std::map<std::string, PrimitiveFactory>&);
  const std::pair<OpFamily, Register> families[] = {{OpFamily::Elementwise, register_elementwise},
                                                    {OpFamily::Layout, register_layout},
                                                    {OpFamily::Linalg, register_linalg},
                                                    {OpFamily::Reduce, register_reduce},
                                                    {OpFamily::Indexing, register_indexing},
                                                    {OpFamily::Nn, register_nn},
                                                    {OpFamily::Attention, register_attention},
                                                    {OpFamily::Optim, register_optim},
                                                    {OpFamily::Random, register_random}};
  for (const auto& [family, register_family] : families) {
    std::map<std::string, PrimitiveFactory> added;
    register_family(added);
    for (auto& [name, factory] : added) {
      check_registration(name, family, OpProvider::ParserFactory);
      f[name] = std::move(factory);
    }
  }
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

PrimitivePtr make_primitive(const std::string& name, const std::string& attributes) {
  PrimitiveFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    if (std::shared_ptr<const CustomOpDefinition> custom = find_custom_op(name))
      return make_custom_primitive(std::move(custom), attributes);
    throw UnregisteredOpError(
        fmt::format("make_primitive: unknown op '{}' (attributes '{}'): neither a built-in nor a registered custom op",
                    name, attributes),
        name);
  }
  AttributeMap map(name, attributes);
  PrimitivePtr primitive = factory(map);
  map.check_all_read();
  return primitive;
}

std::vector<std::string> primitive_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

void register_primitive(const std::string& name, PrimitiveFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

}  // namespace tessera::compiler
