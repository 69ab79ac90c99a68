// The one table of primitives. A row says, for one op, everything the layers above
// must provide and where:
//   name      its IR spelling (Primitive::name(); for AccumulateAdd its sharding-rule key)
//   family    the file name every layer uses for it: backend/cpu/eval_<family>.cpp,
//             backend/cuda/eval_<family>.cpp, spmd/rules_<family>.cpp, and the
//             parser's register_<family> (compiler/primitive_registry.cpp)
//   CUDA      a kernel in backend/cuda/eval_<family>.cpp, or the reason there is none
//   sharding  a rule in spmd/rules_<family>.cpp, or the reason there is none
// The implementations stay in their layers (the CUDA kernel cannot live below the CUDA
// backend), but each layer registers them family by family and checks every name
// against this table as it does (check_registration): an op the table does not list,
// one registered from another family's file, or one the table says has no kernel or
// rule is an Error at the first use of that registry. The op-coverage tests
// (tests/spmd/test_op_coverage.cpp, tests/cuda/test_op_coverage_cuda.cpp) check the
// other direction: every row has its parser factory, kernel and rule.
//
// A new primitive is one row here plus its class (ir/primitives/<family>.h), its CPU
// evaluation, its parser factory, and a kernel and a rule or the reasons for none.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

enum class OpFamily { Elementwise, Layout, Linalg, Reduce, Indexing, Nn, Attention, Optim, Random, Collective };
inline constexpr int kNumOpFamilies = 10;

// "elementwise", "layout", ... (the file-name part).
std::string_view family_name(OpFamily family);

struct PrimitiveEntry {
  std::string_view name;
  OpFamily family;
  // Empty when the CUDA backend has a kernel; else why it has none.
  std::string_view no_cuda_kernel;
  // Empty when spmd/ has a sharding rule; else why it has none.
  std::string_view no_sharding_rule;
  // False for a rule key that is not an IR name (AccumulateAdd prints as "add" and
  // parses back as Binary add; only its sharding rule is its own).
  bool ir_name = true;
};

// Every primitive, sorted by name.
const std::vector<PrimitiveEntry>& primitive_table();
// The row for `name`, or nullptr.
const PrimitiveEntry* find_primitive_entry(std::string_view name);

// The table as markdown, one row per op (docs/ops.md holds it; `tessera info --ops`
// prints it).
std::string primitive_table_markdown();

// What a layer registers for a primitive.
enum class OpProvider { ParserFactory, CudaKernel, ShardingRule };

// Called by each built-in registry for every name a family's registration added:
// throws Error when the table does not list `name`, lists it under another family
// than `registering`, or says it has no `provider`.
void check_registration(std::string_view name, OpFamily registering, OpProvider provider);

}  // namespace tessera
