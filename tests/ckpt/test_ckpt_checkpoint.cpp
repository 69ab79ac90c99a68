// CheckpointManager: bitwise round trips into a template tree, the manifest, atomic
// replacement, retention, corruption detected by verify() with restore_latest() falling
// back to an older checkpoint, structure mismatches and unwritable run directories.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/core/ops.h"

namespace tessera::ckpt {
namespace {

using tessera::testing::flip_bit;
using tessera::testing::read_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;
namespace fs = std::filesystem;

Array ramp(const Shape& shape, DType dtype, double start) {
  std::vector<double> values(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + 0.37 * static_cast<double>(i);
  return Array::from_vector<double>(values, shape).astype(dtype).eval();
}

CheckpointState make_state(int64_t step) {
  const double s = static_cast<double>(step);
  CheckpointState state;
  state.step = step;
  state.params =
      Tree{{"embed", ramp({5, 4}, DType::Float32, s)},
           {"layers",
            Tree::list({Tree{{"w", ramp({4, 4}, DType::BFloat16, s + 1)}, {"b", ramp({4}, DType::Float16, s + 2)}},
                        Tree{{"w", ramp({4, 4}, DType::BFloat16, s + 3)}, {"b", ramp({4}, DType::Float16, s + 4)}}})}};
  state.opt_state =
      Tree{{"step", Array::from_vector<int64_t>({step * 1000003}, Shape{})},
           {"mu", state.params.map([](const Array& a) { return (a.astype(DType::Float32) * 0.5).eval(); })}};
  state.extra = {{"config", {{"lr", 3e-4}, {"model", "gpt2-tiny"}}}, {"data", {{"epoch", 1}, {"index", step}}}};
  return state;
}

// A template: same structure and types, different values.
Tree zeros_like(const Tree& tree) {
  return tree.map([](const Array& a) { return Array::placeholder(a.shape(), a.dtype()); });
}

void expect_same_tree(const Tree& a, const Tree& b) {
  ASSERT_EQ(a.paths(), b.paths());
  const std::vector<Array> la = a.leaves(), lb = b.leaves();
  for (size_t i = 0; i < la.size(); ++i) {
    SCOPED_TRACE(a.paths()[i]);
    ASSERT_EQ(type_string(la[i]), type_string(lb[i]));
    EXPECT_EQ(std::memcmp(la[i].raw_data(), lb[i].raw_data(), la[i].nbytes()), 0);
  }
}

std::vector<int64_t> steps(const CheckpointManager& manager) {
  std::vector<int64_t> out;
  for (const CheckpointInfo& info : manager.list()) out.push_back(info.step);
  return out;
}

// restore_latest() brings back make_state(1) bitwise (the newer checkpoints being
// damaged); returns the warnings it gave.
std::vector<std::string> expect_restores_step_one(const CheckpointManager& manager) {
  std::vector<std::string> warnings;
  const CheckpointState expected = make_state(1);
  const std::optional<CheckpointState> restored =
      manager.restore_latest(zeros_like(expected.params), zeros_like(expected.opt_state),
                             [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_TRUE(restored.has_value());
  if (restored) {
    EXPECT_EQ(restored->step, 1);
    expect_same_tree(restored->params, expected.params);
    EXPECT_EQ(restored->extra, expected.extra);
  }
  return warnings;
}

TEST(Checkpoint, RoundTripIsBitwise) {
  TempDir run;
  CheckpointManager manager(run.path());
  const CheckpointState state = make_state(100);
  const fs::path path = manager.save(state);
  EXPECT_EQ(path, run / "checkpoints/step_00000100");
  EXPECT_TRUE(CheckpointManager::verify(path).ok);

  const CheckpointState back = CheckpointManager::load(path, zeros_like(state.params), zeros_like(state.opt_state));
  EXPECT_EQ(back.step, 100);
  EXPECT_EQ(back.extra, state.extra);
  expect_same_tree(back.params, state.params);
  expect_same_tree(back.opt_state, state.opt_state);
  EXPECT_EQ(back.opt_state.at("step").leaf().item<int64_t>(), 100000300);

  // The manifest, checked against an independent hash of each file.
  const nlohmann::json manifest = read_manifest(path);
  EXPECT_EQ(manifest["format"], "tessera-checkpoint");
  EXPECT_EQ(manifest["version"], 1);
  EXPECT_EQ(manifest["step"], 100);
  EXPECT_EQ(manifest["extra"], state.extra);
  for (const char* name : {"params.safetensors", "opt_state.safetensors"}) {
    const std::string bytes = read_bytes(path / name);
    EXPECT_EQ(manifest["files"][name]["bytes"], bytes.size());
    EXPECT_EQ(manifest["files"][name]["xxh3"], fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size())));
  }
  const std::vector<CheckpointInfo> infos = manager.list();
  ASSERT_EQ(infos.size(), 1u);
  EXPECT_EQ(infos[0].bytes, fs::file_size(path / "params.safetensors") + fs::file_size(path / "opt_state.safetensors") +
                                fs::file_size(path / "manifest.json"));
  EXPECT_EQ(infos[0].created, manifest["created"]);
  // Nothing but the committed checkpoint is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(run / "checkpoints"), {}), 1);
}

// A caller that holds only some leaves (a pipeline process: another stage's are
// placeholders) loads with Placeholders::kNotHeld: its leaves come back bitwise, the
// others stay placeholders (never read), and a placeholder's type is still checked.
TEST(Checkpoint, LoadsOnlyTheHeldLeavesWhenPlaceholdersAreNotHeld) {
  TempDir run;
  CheckpointManager manager(run.path());
  const CheckpointState state = make_state(7);
  const fs::path path = manager.save(state);
  // Hold layer 0 and the embedding, not layer 1; of the optimizer state, the step only.
  auto holds = [](const std::string& p) { return !p.starts_with("layers.1") && !p.starts_with("mu."); };
  auto template_of = [&](const Tree& tree, const std::string& prefix) {
    const std::vector<std::string> paths = tree.paths();
    std::vector<Array> leaves = tree.leaves();
    for (size_t i = 0; i < leaves.size(); ++i)
      leaves[i] = holds(prefix + paths[i]) ? zeros(leaves[i].shape(), leaves[i].dtype()).eval()
                                           : Array::placeholder(leaves[i].shape(), leaves[i].dtype());
    return tree.with_leaves(leaves);
  };
  const Tree params_like = template_of(state.params, ""), opt_like = template_of(state.opt_state, "");
  const CheckpointState back = CheckpointManager::load(path, params_like, opt_like, Placeholders::kNotHeld);
  EXPECT_EQ(back.step, 7);
  for (const auto& [got, want] :
       {std::pair{&back.params, &state.params}, std::pair{&back.opt_state, &state.opt_state}}) {
    const std::vector<std::string> paths = want->paths();
    const std::vector<Array> g = got->leaves(), w = want->leaves();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      SCOPED_TRACE(paths[i]);
      if (!holds(paths[i])) {
        EXPECT_TRUE(g[i].is_placeholder());
        continue;
      }
      ASSERT_TRUE(g[i].is_evaluated());
      EXPECT_EQ(type_string(g[i]), type_string(w[i]));
      EXPECT_EQ(std::memcmp(g[i].raw_data(), w[i].raw_data(), w[i].nbytes()), 0);
    }
  }
  // The same templates as structure (the default) read every leaf.
  const CheckpointState whole = CheckpointManager::load(path, params_like, opt_like);
  expect_same_tree(whole.params, state.params);
  expect_same_tree(whole.opt_state, state.opt_state);
  // A placeholder of another type is still an error naming the tensor.
  Tree wrong = params_like;
  wrong["layers"] =
      Tree::list({params_like.at("layers").elements()[0], Tree{{"w", Array::placeholder({4, 5}, DType::BFloat16)},
                                                               {"b", Array::placeholder({4}, DType::Float16)}}});
  try {
    CheckpointManager::load(path, wrong, opt_like, Placeholders::kNotHeld);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layers.1.w' is bf16[4, 4] in the checkpoint but bf16[4, 5] is expected"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, SavingAStepAgainReplacesItAndStaleTmpDirsAreRemoved) {
  TempDir run;
  CheckpointManager manager(run.path());
  manager.save(make_state(7));
  write_bytes(run / "checkpoints/step_00000009.tmp-99999/params.safetensors", "half written");
  CheckpointState again = make_state(7);
  again.extra["note"] = "second";
  const fs::path path = manager.save(again);
  EXPECT_FALSE(fs::exists(run / "checkpoints/step_00000009.tmp-99999"));
  EXPECT_EQ(read_manifest(path)["extra"]["note"], "second");
  EXPECT_TRUE(CheckpointManager::verify(path).ok);
  EXPECT_EQ(steps(manager), (std::vector<int64_t>{7}));
  EXPECT_EQ(std::distance(fs::directory_iterator(run / "checkpoints"), {}), 1);
}

TEST(Checkpoint, Retention) {
  TempDir run;
  CheckpointManager manager(run.path(), RetentionPolicy{.keep_last = 2, .keep_every = 4});
  for (int64_t step = 1; step <= 10; ++step) manager.save(make_state(step));
  EXPECT_EQ(steps(manager), (std::vector<int64_t>{4, 8, 9, 10}));

  TempDir run2;
  CheckpointManager last_only(run2.path(), RetentionPolicy{.keep_last = 1});
  for (int64_t step : {5, 10, 15}) last_only.save(make_state(step));
  EXPECT_EQ(steps(last_only), (std::vector<int64_t>{15}));
  EXPECT_THROW(CheckpointManager(run2.path(), RetentionPolicy{.keep_last = 0}), ValueError);
}

TEST(Checkpoint, CorruptionIsDetectedAndRestoreFallsBack) {
  TempDir run;
  CheckpointManager manager(run.path(), RetentionPolicy{.keep_last = 5});
  for (int64_t step : {1, 2, 3}) manager.save(make_state(step));
  const fs::path dir = run / "checkpoints";

  // Step 3: truncated params; step 2: one bit flipped in the optimizer state.
  fs::resize_file(dir / "step_00000003/params.safetensors",
                  fs::file_size(dir / "step_00000003/params.safetensors") - 5);
  flip_bit(dir / "step_00000002/opt_state.safetensors", -3);

  const VerifyResult truncated = CheckpointManager::verify(dir / "step_00000003");
  EXPECT_FALSE(truncated.ok);
  EXPECT_NE(truncated.problem.find("params.safetensors: size mismatch"), std::string::npos) << truncated.problem;
  const VerifyResult flipped = CheckpointManager::verify(dir / "step_00000002");
  EXPECT_FALSE(flipped.ok);
  EXPECT_NE(flipped.problem.find("opt_state.safetensors: checksum mismatch"), std::string::npos) << flipped.problem;
  EXPECT_TRUE(CheckpointManager::verify(dir / "step_00000001").ok);
  EXPECT_THROW(CheckpointManager::load(dir / "step_00000002", zeros_like(make_state(2).params),
                                       zeros_like(make_state(2).opt_state)),
               IOError);

  std::vector<std::string> warnings = expect_restores_step_one(manager);
  const CheckpointState expected = make_state(1);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("step_00000003"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("size mismatch"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("step_00000002"), std::string::npos) << warnings[1];

  // A missing manifest (a directory renamed by hand, a foreign tool) is reported too.
  fs::remove(dir / "step_00000001/manifest.json");
  EXPECT_FALSE(CheckpointManager::verify(dir / "step_00000001").ok);
  warnings.clear();
  EXPECT_FALSE(manager.restore_latest(zeros_like(expected.params), zeros_like(expected.opt_state),
                                      [&](const std::string& w) { warnings.push_back(w); }));
  EXPECT_EQ(warnings.size(), 3u);

  TempDir empty;
  EXPECT_FALSE(CheckpointManager(empty.path()).restore_latest(Tree{}, Tree{}, nullptr).has_value());
}

// A manifest that is valid JSON with the wrong types (a hand edit, another tool) is a
// corrupt checkpoint like any other: verify() says what is wrong and restore_latest()
// falls back, instead of a JSON type error ending the resume.
TEST(Checkpoint, ManifestWithWrongTypesIsCorruptAndRestoreFallsBack) {
  TempDir run;
  CheckpointManager manager(run.path(), RetentionPolicy{.keep_last = 5});
  for (int64_t step : {1, 2, 3}) manager.save(make_state(step));
  const fs::path dir = run / "checkpoints";
  auto rewrite_manifest = [&](const fs::path& checkpoint, const nlohmann::json& manifest) {
    write_bytes(checkpoint / "manifest.json", manifest.dump());
  };
  nlohmann::json manifest = read_manifest(dir / "step_00000003");
  manifest["format"] = 7;
  rewrite_manifest(dir / "step_00000003", manifest);
  rewrite_manifest(dir / "step_00000002", nlohmann::json::array({1, 2}));

  const VerifyResult wrong_format = CheckpointManager::verify(dir / "step_00000003");
  EXPECT_FALSE(wrong_format.ok);
  EXPECT_NE(wrong_format.problem.find("format is 7"), std::string::npos) << wrong_format.problem;
  EXPECT_FALSE(CheckpointManager::verify(dir / "step_00000002").ok);

  EXPECT_EQ(expect_restores_step_one(manager).size(), 2u);
}

// A number past double's range is an out_of_range in the JSON library, not a parse_error;
// it too is a corrupt manifest (found by the fuzz targets), so the resume falls back.
TEST(Checkpoint, ManifestWithNumberOverflowIsCorruptAndRestoreFallsBack) {
  TempDir run;
  CheckpointManager manager(run.path(), RetentionPolicy{.keep_last = 5});
  for (int64_t step : {1, 2, 3}) manager.save(make_state(step));
  const fs::path dir = run / "checkpoints";
  write_bytes(dir / "step_00000003" / "manifest.json", R"({"format": "tessera-checkpoint", "step": 1e999})");
  write_bytes(dir / "step_00000002" / "manifest.json", R"({"version": -1e400})");

  const VerifyResult overflow = CheckpointManager::verify(dir / "step_00000003");
  EXPECT_FALSE(overflow.ok);
  EXPECT_NE(overflow.problem.find("manifest.json: malformed JSON"), std::string::npos) << overflow.problem;
  EXPECT_NE(overflow.problem.find("number overflow parsing '1e999'"), std::string::npos) << overflow.problem;
  EXPECT_EQ(expect_restores_step_one(manager).size(), 2u);
}

TEST(Checkpoint, StructureMismatchNamesThePathAndBothTypes) {
  TempDir run;
  CheckpointManager manager(run.path());
  const CheckpointState state = make_state(4);
  const fs::path path = manager.save(state);
  const Tree opt = zeros_like(state.opt_state);

  const auto expect_mismatch = [&](const Tree& params_like, const std::vector<std::string>& parts) {
    try {
      CheckpointManager::load(path, params_like, opt);
      ADD_FAILURE() << "expected ConfigError";
    } catch (const ConfigError& e) {
      // Another model's checkpoint: a config to fix, never damage to skip past.
      for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
    }
  };
  Tree wrong_dtype = zeros_like(state.params);
  wrong_dtype["embed"] = Array::placeholder({5, 4}, DType::BFloat16);
  expect_mismatch(wrong_dtype, {"'embed'", "f32[5, 4]", "bf16[5, 4]"});
  Tree wrong_shape = zeros_like(state.params);
  wrong_shape["embed"] = Array::placeholder({4, 5}, DType::Float32);
  expect_mismatch(wrong_shape, {"'embed'", "f32[5, 4]", "f32[4, 5]"});
  Tree missing = zeros_like(state.params);
  missing["extra_head"] = Array::placeholder({2}, DType::Float32);
  expect_mismatch(missing, {"no tensor 'extra_head'"});
  Tree fewer = zeros_like(state.params);
  fewer = Tree{{"embed", fewer.at("embed")}};
  expect_mismatch(fewer, {"'layers.0.b'", "not in the expected structure"});
}

TEST(Checkpoint, CollidingPathsCannotBeSaved) {
  TempDir run;
  CheckpointManager manager(run.path());
  CheckpointState state;
  state.params = Tree{{"a.b", Array::scalar(1.0)}, {"a", Tree{{"b", Array::scalar(2.0)}}}};
  EXPECT_THROW(manager.save(state), ValueError);
  EXPECT_TRUE(manager.list().empty());
}

TEST(Checkpoint, UnwritableRunDirectoryIsAnIOError) {
  TempDir tmp;
  write_bytes(tmp / "file", "not a directory");
  try {
    CheckpointManager manager(tmp / "file/run");
    FAIL() << "expected IOError";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find((tmp / "file/run/checkpoints").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Not a directory"), std::string::npos) << e.what();
  }

  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permissions are not enforced";
  fs::create_directories(tmp / "readonly");
  ::chmod((tmp / "readonly").c_str(), 0500);
  try {
    CheckpointManager manager(tmp / "readonly");
    FAIL() << "expected IOError";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find((tmp / "readonly").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::ckpt
