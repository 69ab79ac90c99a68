// The primitives that deliberately have no sharding rule. The op-coverage test
// (tests/spmd/test_op_coverage.cpp) fails for a primitive that has neither a rule
// (rules_<family>.cpp) nor an entry here, so a new op cannot silently fall back to
// "pin it with a sharding constraint".
#include "tessera/spmd/sharding_rule.h"

namespace tessera::spmd {

const std::map<std::string, std::string>& primitives_without_sharding_rule() {
  static const std::map<std::string, std::string> opt_out = {
      {"all_gather", "inserted by the partitioner into per-device programs, never partitioned"},
      {"all_reduce", "inserted by the partitioner into per-device programs, never partitioned"},
      {"all_to_all", "inserted by the partitioner into per-device programs, never partitioned"},
      {"reduce_scatter", "inserted by the partitioner into per-device programs, never partitioned"},
      {"shard_pad", "inserted by the partitioner into per-device programs, never partitioned"},
      {"shard_slice", "inserted by the partitioner into per-device programs, never partitioned"},
      {"fusion", "made by the fusion pass, which runs after partitioning"},
      {"matmul_epilogue", "made by the GEMM-epilogue pass, which runs after partitioning"},
      {"random_bernoulli",
       "counter-based random numbers: a sharded draw must equal the unsharded one, which needs per-shard counter "
       "offsets (not written); the partitioner asks for a constraint"},
      {"random_normal", "as random_bernoulli"},
      {"random_split", "as random_bernoulli (keys are tiny: replicate them)"},
      {"random_uniform", "as random_bernoulli"},
  };
  return opt_out;
}

}  // namespace tessera::spmd
