// Op coverage against the one primitive table (ir/primitive_table.h): the parser knows
// exactly the table's ops, every row has a sharding rule or the table's reason for
// none, every rule names a row, every named primitive class is known to the parser,
// each family's files line up across the layers, and a registration the table does
// not allow is refused. (The CUDA kernels' coverage:
// tests/cuda/test_op_coverage_cuda.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "tessera/base/error.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/ir/primitive_table.h"
#include "tessera/ir/primitives/elementwise.h"
#include "tessera/spmd/sharding_rule.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

std::set<std::string> parser_names() {
  const std::vector<std::string> v = compiler::primitive_names();
  return {v.begin(), v.end()};
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(OpCoverage, TheParserKnowsExactlyTheTablesOps) {
  const std::set<std::string> parsed = parser_names();
  std::set<std::string> listed;
  for (const PrimitiveEntry& e : primitive_table())
    if (e.ir_name) listed.insert(std::string(e.name));
  ASSERT_GT(listed.size(), 60u);
  for (const std::string& name : listed)
    EXPECT_TRUE(parsed.count(name)) << name << " is in the primitive table but has no parser factory "
                                    << "(src/compiler/primitive_registry.cpp, register_<family>)";
  for (const std::string& name : parsed)
    EXPECT_TRUE(listed.count(name)) << "the parser knows '" << name << "', which the primitive table does not list";
}

TEST(OpCoverage, EveryPrimitiveHasAShardingRuleOrAReasonNotTo) {
  const std::vector<std::string> keys = spmd::sharding_rule_keys();
  const std::set<std::string> rules(keys.begin(), keys.end());
  for (const PrimitiveEntry& e : primitive_table()) {
    const std::string name(e.name);
    const bool has_rule = rules.count(name) > 0;
    const bool opted_out = !e.no_sharding_rule.empty();
    EXPECT_TRUE(has_rule || opted_out) << name << " has no sharding rule (src/spmd/rules_" << family_name(e.family)
                                       << ".cpp) and the primitive table gives no reason";
    EXPECT_FALSE(has_rule && opted_out) << name << " has a rule and an opt-out: remove the opt-out";
  }
  for (const std::string& key : keys)
    EXPECT_NE(find_primitive_entry(key), nullptr) << "the rule '" << key << "' names no row of the primitive table";
  // A primitive's own rule key is a row too.
  EXPECT_NE(find_primitive_entry(AccumulateAdd().sharding_rule_key()), nullptr);
}

// A family's files have the same name in every layer, and each layer has the file
// exactly when the table says some op of the family needs it.
TEST(OpCoverage, FamilyFilesLineUpAcrossTheLayers) {
  const fs::path src = fs::path(TESSERA_SOURCE_DIR) / "src";
  std::set<std::string> families;
  for (int f = 0; f < kNumOpFamilies; ++f) {
    const auto family = static_cast<OpFamily>(f);
    const std::string name(family_name(family));
    families.insert(name);
    bool any_kernel = false, any_rule = false, any_op = false;
    for (const PrimitiveEntry& e : primitive_table()) {
      if (e.family != family) continue;
      any_op = true;
      any_kernel = any_kernel || e.no_cuda_kernel.empty();
      any_rule = any_rule || e.no_sharding_rule.empty();
    }
    EXPECT_TRUE(any_op) << "family " << name << " has no op";
    // Collectives evaluate on the CPU through the communicators (src/spmd/collectives.cpp).
    const fs::path cpu =
        family == OpFamily::Collective ? src / "spmd/collectives.cpp" : src / ("backend/cpu/eval_" + name + ".cpp");
    EXPECT_TRUE(fs::exists(cpu)) << cpu;
    const fs::path cuda = src / ("backend/cuda/eval_" + name + ".cpp");
    EXPECT_EQ(fs::exists(cuda), any_kernel) << cuda;
    if (any_kernel && fs::exists(cuda)) {
      EXPECT_NE(read_text(cuda).find("void register_" + name + "_kernels()"), std::string::npos) << cuda;
    }
    const fs::path rules = src / ("spmd/rules_" + name + ".cpp");
    EXPECT_EQ(fs::exists(rules), any_rule) << rules;
    if (any_rule && fs::exists(rules)) {
      EXPECT_NE(read_text(rules).find("void register_" + name + "()"), std::string::npos) << rules;
    }
  }
  // Every per-family file is named after a family (eval_<family>[_part].cpp).
  const std::regex family_file(R"re((eval|rules)_([a-z]+)(_[a-z_]+)?\.cpp)re");
  for (const char* dir : {"backend/cpu", "backend/cuda", "spmd"}) {
    for (const auto& entry : fs::directory_iterator(src / dir)) {
      const std::string file = entry.path().filename().string();
      std::smatch m;
      if (!std::regex_match(file, m, family_file)) continue;
      EXPECT_TRUE(families.count(m[2])) << dir << "/" << file << " is named after no family of the primitive table";
    }
  }
}

// The registries check every built-in name against the table as they register it.
TEST(OpCoverage, ARegistrationTheTableDoesNotAllowIsRefused) {
  EXPECT_NO_THROW(check_registration("matmul", OpFamily::Linalg, OpProvider::ShardingRule));
  try {
    check_registration("made_up_op", OpFamily::Nn, OpProvider::CudaKernel);
    ADD_FAILURE() << "an unlisted op was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not list 'made_up_op'"), std::string::npos) << e.what();
  }
  try {
    check_registration("softmax", OpFamily::Elementwise, OpProvider::ParserFactory);
    ADD_FAILURE() << "a registration from the wrong family's file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("puts 'softmax' in nn"), std::string::npos) << e.what();
  }
  try {
    check_registration("all_reduce", OpFamily::Collective, OpProvider::ShardingRule);
    ADD_FAILURE() << "a rule for an op the table opts out was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("remove the opt-out"), std::string::npos) << e.what();
  }
  try {
    check_registration("accumulate_add", OpFamily::Elementwise, OpProvider::ParserFactory);
    ADD_FAILURE() << "a parser factory for a rule key was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no IR name"), std::string::npos) << e.what();
  }
}

// Primitives with a fixed name (`return "name";` in ir/primitives/*.h) are known to the
// parser, so programs using them parse, deserialize and enter the compilation cache.
TEST(OpCoverage, EveryNamedPrimitiveClassHasAParserFactory) {
  const std::regex fixed_name(R"re(std::string name\(\) const override \{ return "([a-z_0-9]+)"; \})re");
  const std::set<std::string> names = parser_names();
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

TEST(OpCoverage, DocsOpsMdIsTheTableTesseraInfoPrints) {
  const std::string docs = read_text(fs::path(TESSERA_SOURCE_DIR) / "docs/ops.md");
  EXPECT_NE(docs.find(primitive_table_markdown()), std::string::npos)
      << "docs/ops.md is out of date: regenerate its table with `build/bin/tessera info --ops`";
}
