// Op coverage: every primitive the IR parser knows has a sharding rule or an explicit
// opt-out with its reason (src/spmd/rules_opt_out.cpp), every rule and opt-out names a
// primitive, and every primitive class in the IR headers is known to the parser. (The
// CUDA kernels' coverage: tests/cuda/test_op_coverage_cuda.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "tessera/compiler/primitive_registry.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/spmd/sharding_rule.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

std::set<std::string> primitive_names() {
  const std::vector<std::string> v = compiler::primitive_names();
  return {v.begin(), v.end()};
}

}  // namespace

TEST(OpCoverage, EveryPrimitiveHasAShardingRuleOrAReasonNotTo) {
  const std::vector<std::string> keys = spmd::sharding_rule_keys();
  const std::set<std::string> rules(keys.begin(), keys.end());
  const auto& opt_out = spmd::primitives_without_sharding_rule();
  const std::set<std::string> names = primitive_names();
  ASSERT_GT(names.size(), 60u);
  for (const std::string& name : names) {
    const bool has_rule = rules.count(name) > 0;
    const bool opted_out = opt_out.count(name) > 0;
    EXPECT_TRUE(has_rule || opted_out) << name << " has no sharding rule (src/spmd/rules_<family>.cpp) and no opt-out "
                                       << "(src/spmd/rules_opt_out.cpp)";
    EXPECT_FALSE(has_rule && opted_out) << name << " has a rule and an opt-out: remove the opt-out";
  }
  for (const auto& [name, reason] : opt_out) {
    EXPECT_TRUE(names.count(name)) << "the opt-out names '" << name << "', which is not a primitive";
    EXPECT_FALSE(reason.empty()) << name;
  }
  // A rule key is a primitive's name, or the key a primitive names for itself.
  std::set<std::string> own_keys = {AccumulateAdd().sharding_rule_key()};
  for (const std::string& key : keys)
    EXPECT_TRUE(names.count(key) || own_keys.count(key)) << "the rule '" << key << "' names no primitive";
}

// Primitives with a fixed name (`return "name";` in ir/primitives/*.h) are known to the
// parser, so programs using them parse, deserialize and enter the compilation cache.
TEST(OpCoverage, EveryNamedPrimitiveClassHasAParserFactory) {
  const std::regex fixed_name(R"re(std::string name\(\) const override \{ return "([a-z_0-9]+)"; \})re");
  const std::set<std::string> names = primitive_names();
  int found = 0;
  for (const auto& e : fs::directory_iterator(fs::path(TESSERA_SOURCE_DIR) / "include/tessera/ir/primitives")) {
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), fixed_name), end; it != end; ++it) {
      ++found;
      EXPECT_TRUE(names.count((*it)[1])) << (*it)[1] << " (" << e.path().filename().string()
                                         << ") has no parser factory (src/compiler/primitive_registry.cpp)";
    }
  }
  EXPECT_GE(found, 20) << "the scan found too few primitive classes";
}
