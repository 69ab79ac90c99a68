// Shared by the Hugging Face interop tests: the committed fixtures and golden
// (tests/oracles/hf_models.py), temporary directories and tree comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/core/ops.h"
#include "tessera/core/random.h"
#include "tessera/core/tree.h"
#include "tessera/models/model.h"

namespace tessera::test {

inline const std::filesystem::path kSourceDir = TESSERA_SOURCE_DIR;
inline const std::filesystem::path kHfFixtures = kSourceDir / "tests/interop/fixtures";

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return nlohmann::json::parse(in);
}

inline const nlohmann::json& hf_golden() {
  static const nlohmann::json golden = read_json_file(kSourceDir / "tests/oracles/goldens/hf_models.json");
  return golden;
}

// The golden's token ids [2, 7] as int32.
inline Array golden_tokens() {
  std::vector<int32_t> flat;
  for (const auto& row : hf_golden().at("tokens"))
    for (const auto& id : row) flat.push_back(id.get<int32_t>());
  const int64_t batch = static_cast<int64_t>(hf_golden().at("tokens").size());
  return Array::from_vector(flat, {batch, static_cast<int64_t>(flat.size()) / batch});
}

// An empty directory under the system temp dir named after the running test.
inline std::filesystem::path hf_test_dir(const std::string& what = "") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tessera_hf_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + what);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A writable copy of a committed fixture.
inline std::filesystem::path copy_fixture(const std::string& name, const std::filesystem::path& into) {
  const std::filesystem::path out = into / name;
  std::filesystem::copy(kHfFixtures / name, out, std::filesystem::copy_options::recursive);
  for (const auto& entry : std::filesystem::directory_iterator(out))
    std::filesystem::permissions(entry.path(),
                                 std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return out;
}

// Same paths, dtypes, shapes and bytes.
inline void expect_trees_bitwise_equal(const Tree& a, const Tree& b) {
  ASSERT_EQ(a.paths(), b.paths());
  const std::vector<Array> la = a.leaves(), lb = b.leaves();
  const std::vector<std::string> paths = a.paths();
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_EQ(la[i].dtype(), lb[i].dtype()) << paths[i];
    ASSERT_EQ(la[i].shape(), lb[i].shape()) << paths[i];
    const Array x = la[i].eval(), y = lb[i].eval();
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << paths[i] << " differs";
  }
}

// Parameters with every leaf random (norm scales and biases too), so a mapping that
// swaps or drops a tensor shows in the round trip.
// The vocabulary padding stays zero, as in a model (the files hold `vocab` rows only).
inline Tree random_params(const models::ModelConfig& config, uint64_t seed) {
  const Tree init = models::strip_vocabulary(config, models::Model(config).init(seed));
  std::vector<Array> leaves = init.leaves();
  for (size_t i = 0; i < leaves.size(); ++i)
    leaves[i] = random::normal(key(seed * 1000 + i), leaves[i].shape(), DType::Float32, 0.0, 0.3).eval();
  return models::pad_vocabulary(config, init.with_leaves(leaves));
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tessera::test
