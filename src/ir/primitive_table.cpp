// The rows of ir/primitive_table.h. Elementwise and reduction kinds come from the op
// list (base/op_list.h), so a new unary or binary op needs no row here.
#include "tessera/ir/primitive_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "tessera/base/error.h"
#include "tessera/base/op_list.h"

namespace tessera {

namespace {

constexpr std::string_view kCollectiveNoRule =
    "inserted by the partitioner into per-device programs, never partitioned";
constexpr std::string_view kRandomNoRule =
    "counter-based random numbers: a sharded draw must equal the unsharded one, which needs per-shard counter "
    "offsets (not written); the partitioner asks for a sharding constraint";

std::vector<PrimitiveEntry> make_table() {
  std::vector<PrimitiveEntry> t;
  auto row = [&t](std::string_view name, OpFamily family, std::string_view no_kernel = {},
                  std::string_view no_rule = {}) {
    t.push_back({name, family, no_kernel, no_rule});
  };
  using F = OpFamily;

  // elementwise
#define TESSERA_TABLE_ROW(kind, ir_name) row(ir_name, F::Elementwise);
  TESSERA_UNARY_OPS(TESSERA_TABLE_ROW)
  TESSERA_BINARY_OPS(TESSERA_TABLE_ROW)
#undef TESSERA_TABLE_ROW
  for (const char* name : {"where", "convert", "stop_gradient", "identity"}) row(name, F::Elementwise);
  row("fusion", F::Elementwise, {}, "made by the fusion pass, which runs after partitioning");
  t.push_back({"accumulate_add", F::Elementwise, {}, {}, /*ir_name=*/false});

  // layout
  for (const char* name : {"reshape", "transpose", "broadcast_to", "slice", "slice_pad", "concatenate"})
    row(name, F::Layout);
  for (const char* name : {"offload_to_host", "load_from_host"})
    row(name, F::Layout, "run by the CUDA executable as copies on its side stream (backend/cuda/host_offload.h)",
        "made by the offload pass, which runs after partitioning");

  // linalg
  row("matmul", F::Linalg);
  for (const char* name : {"grouped_matmul", "grouped_matmul_weight_grad"}) row(name, F::Linalg);
  row("matmul_epilogue", F::Linalg, {}, "made by the GEMM-epilogue pass, which runs after partitioning");
  row("quantized_matmul", F::Linalg);

  // reduce
#define TESSERA_TABLE_ROW(kind, ir_name) row(ir_name, F::Reduce);
  TESSERA_REDUCE_OPS(TESSERA_TABLE_ROW)
#undef TESSERA_TABLE_ROW
  row("argmax", F::Reduce);
  row("argmin", F::Reduce);

  // indexing
  for (const char* name : {"take", "take_along_axis", "scatter_add", "scatter_add_along_axis"}) row(name, F::Indexing);
  for (const char* name : {"expert_dispatch", "expert_combine"})
    row(name, F::Indexing,
        "traced only where an expert axis splits the experts over devices, and the partitioner lowers it to "
        "ragged_all_to_all");

  // nn
  for (const char* name : {"softmax", "log_softmax", "softmax_grad", "log_softmax_grad", "layer_norm", "rms_norm",
                           "layer_norm_grad", "rms_norm_grad", "cross_entropy", "cross_entropy_grad"})
    row(name, F::Nn);
  row("cross_entropy_with_grad", F::Nn, {}, "made by the classifier-fusion pass, which runs after partitioning");

  // attention
  row("attention", F::Attention);
  row("attention_grad", F::Attention);
  for (const char* name : {"attention_packed", "attention_packed_grad"})
    row(name, F::Attention, {}, "made by the attention-layout pass, which runs after partitioning");

  // optim
  row("adamw_update", F::Optim);
  row("lion_update", F::Optim);

  // random
  row("random_split", F::Random, {}, "keys are a few words: replicated (and see random_uniform)");
  for (const char* name : {"random_uniform", "random_normal", "random_bernoulli"})
    row(name, F::Random, {}, kRandomNoRule);

  // collective
  for (const char* name : {"all_gather", "all_reduce", "all_to_all", "reduce_scatter", "shard_pad", "shard_slice"})
    row(name, F::Collective, {}, kCollectiveNoRule);
  row("ragged_all_to_all", F::Collective, {}, kCollectiveNoRule);

  std::sort(t.begin(), t.end(), [](const PrimitiveEntry& a, const PrimitiveEntry& b) { return a.name < b.name; });
  for (size_t i = 1; i < t.size(); ++i)
    if (t[i].name == t[i - 1].name) fail<Error>("primitive table: '{}' is listed twice", t[i].name);
  return t;
}

const char* provider_name(OpProvider provider) {
  switch (provider) {
    case OpProvider::ParserFactory:
      return "a parser factory";
    case OpProvider::CudaKernel:
      return "a CUDA kernel";
    case OpProvider::ShardingRule:
      return "a sharding rule";
  }
  return "?";
}

}  // namespace

std::string_view family_name(OpFamily family) {
  constexpr std::string_view kNames[] = {"elementwise", "layout",    "linalg", "reduce", "indexing",
                                         "nn",          "attention", "optim",  "random", "collective"};
  static_assert(std::size(kNames) == kNumOpFamilies);
  return kNames[static_cast<int>(family)];
}

const std::vector<PrimitiveEntry>& primitive_table() {
  static const std::vector<PrimitiveEntry> table = make_table();
  return table;
}

const PrimitiveEntry* find_primitive_entry(std::string_view name) {
  const std::vector<PrimitiveEntry>& t = primitive_table();
  auto it = std::lower_bound(t.begin(), t.end(), name,
                             [](const PrimitiveEntry& e, std::string_view n) { return e.name < n; });
  return it != t.end() && it->name == name ? &*it : nullptr;
}

std::string primitive_table_markdown() {
  std::string out =
      "| op | family | CPU | CUDA | sharding rule |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const PrimitiveEntry& e : primitive_table()) {
    const std::string family(family_name(e.family));
    const std::string cpu = !e.ir_name                         ? "(as `add`)"
                            : e.name == "ragged_all_to_all"    ? "`spmd/ragged_all_to_all.cpp`"
                            : e.family == OpFamily::Collective ? "`spmd/collectives.cpp`"
                                                               : "`backend/cpu/eval_" + family + "*.cpp`";
    const std::string cuda = !e.ir_name                 ? "(as `add`)"
                             : e.no_cuda_kernel.empty() ? "`backend/cuda/eval_" + family + ".cpp`"
                                                        : "none: " + std::string(e.no_cuda_kernel);
    const std::string rule =
        e.no_sharding_rule.empty() ? "`spmd/rules_" + family + ".cpp`" : "none: " + std::string(e.no_sharding_rule);
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", e.name, family, cpu, cuda, rule);
  }
  return out;
}

void check_registration(std::string_view name, OpFamily registering, OpProvider provider) {
  const PrimitiveEntry* e = find_primitive_entry(name);
  const std::string_view family = family_name(registering);
  if (e == nullptr)
    fail<Error>(
        "{} for '{}' is registered by the {} family, but the primitive table (src/ir/primitive_table.cpp) "
        "does not list '{}': add its row",
        provider_name(provider), name, family, name);
  if (e->family != registering)
    fail<Error>("{} for '{}' is registered by the {} family's file, but the primitive table puts '{}' in {}",
                provider_name(provider), name, family, name, family_name(e->family));
  const std::string_view reason = provider == OpProvider::CudaKernel     ? e->no_cuda_kernel
                                  : provider == OpProvider::ShardingRule ? e->no_sharding_rule
                                                                         : std::string_view();
  if (!reason.empty())
    fail<Error>("{} for '{}' is registered, but the primitive table says it has none ({}): remove the opt-out",
                provider_name(provider), name, reason);
  if (provider == OpProvider::ParserFactory && !e->ir_name)
    fail<Error>("a parser factory for '{}' is registered, but the primitive table says '{}' is no IR name", name, name);
}

}  // namespace tessera
