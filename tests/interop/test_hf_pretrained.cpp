// Pretrained weights through tessera's own entry points: `ckpt import-hf` (a run
// directory restore_model and `sample` read), restore_model on a Hugging Face
// directory (`sample --ckpt HF_DIR`), `ckpt export-hf`, and `train --init-from`.
#include <gtest/gtest.h>

#include <cmath>

#include "hf_test_util.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/data/loader.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/models/sample.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/pretrained.h"
#include "tessera/train/restore.h"
#include "tessera/train/trainer.h"
#include "train/tiny_corpus.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> warnings;
void collect(const std::string& w) { warnings.push_back(w); }

TEST(HfPretrained, ImportWritesARunThatRestoresToTheSameModel) {
  const fs::path dir = test::hf_test_dir();
  const train::ImportResult result = train::import_hf(test::kHfFixtures / "hf_llama", dir / "run", collect);
  EXPECT_EQ(result.checkpoint, dir / "run/checkpoints/step_00000000");
  EXPECT_TRUE(ckpt::CheckpointManager::verify(result.checkpoint).ok);
  EXPECT_FALSE(result.tokenizer.has_value());  // the fixtures carry no tokenizer files

  const train::RestoredModel restored = train::restore_model(dir / "run", collect);
  const interop::HfModel hf = interop::load_hf_model(test::kHfFixtures / "hf_llama");
  EXPECT_EQ(restored.step, 0);
  EXPECT_EQ(restored.config.model.family, "llama");
  EXPECT_EQ(restored.config.model.kv_heads, 2);
  EXPECT_EQ(restored.tokenizer_spec, "");
  test::expect_trees_bitwise_equal(restored.params, hf.params);
  const json extra = ckpt::read_manifest(result.checkpoint).at("extra");
  EXPECT_EQ(extra.at("hf_token_ids").at("eos_token_id"), 2);
  EXPECT_NE(extra.at("imported_from").get<std::string>().find("hf_llama"), std::string::npos);

  try {
    train::import_hf(test::kHfFixtures / "hf_llama", dir / "run", collect);
    ADD_FAILURE() << "a second import into the same run did not fail";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("already holds checkpoints"), std::string::npos) << e.what();
  }
}

TEST(HfPretrained, RestoreModelReadsAHfDirectoryInPlace) {
  const train::RestoredModel restored = train::restore_model(test::kHfFixtures / "hf_gpt2", collect);
  EXPECT_EQ(restored.step, 0);
  EXPECT_EQ(restored.config.model.family, "gpt2");
  EXPECT_EQ(restored.tokenizer_spec, "");                               // `sample` then asks for --tokenizer
  EXPECT_FALSE(fs::exists(test::kHfFixtures / "hf_gpt2/checkpoints"));  // nothing written into it
  // Greedy sampling with the KV cache equals sampling without it on the imported model.
  models::SampleOptions options;
  options.max_tokens = 6;
  options.temperature = 0;
  const std::vector<int32_t> prompt{5, 17, 94};
  const models::SampleResult cached = models::sample(*restored.model, restored.params, prompt, options);
  options.use_cache = false;
  const models::SampleResult plain = models::sample(*restored.model, restored.params, prompt, options);
  EXPECT_EQ(cached.tokens, plain.tokens);
  EXPECT_EQ(cached.tokens.size(), 6u);
}

TEST(HfPretrained, UnloadableTokenizerFilesImportWithAWarning) {
  const fs::path dir = test::hf_test_dir();
  const fs::path hf = test::copy_fixture("hf_gpt2", dir);
  std::ofstream(hf / "vocab.json") << "not json";
  std::ofstream(hf / "merges.txt") << "#version: 0.2\n";
  warnings.clear();
  const train::ImportResult result = train::import_hf(hf, dir / "run", collect);
  EXPECT_FALSE(result.tokenizer.has_value());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("tokenizer files cannot be loaded"), std::string::npos) << warnings[0];
}

TEST(HfPretrained, ExportFromARunGivesBackTheHfTensorsAndTokenIds) {
  const fs::path dir = test::hf_test_dir();
  train::import_hf(test::kHfFixtures / "hf_gpt2", dir / "run", collect);
  train::ExportOptions options;
  options.max_shard_bytes = interop::parse_byte_size("40KB");
  train::export_hf(dir / "run", dir / "out", options, collect);
  EXPECT_TRUE(fs::exists(dir / "out/model.safetensors.index.json"));
  const interop::HfTensors original = interop::read_hf_tensors(test::kHfFixtures / "hf_gpt2");
  const interop::HfTensors exported = interop::read_hf_tensors(dir / "out");
  ASSERT_EQ(original.size(), exported.size());
  for (const auto& [name, t] : original)
    EXPECT_EQ(t.array.to_vector<float>(), exported.at(name).array.to_vector<float>()) << name;
  const json config = test::read_json_file(dir / "out/config.json");
  EXPECT_EQ(config.at("eos_token_id"), 95);
  EXPECT_EQ(config.at("bos_token_id"), 95);
  // A failing export (no such source) leaves nothing behind.
  EXPECT_THROW(train::export_hf(dir / "nowhere", dir / "out2", options, collect), IOError);
  EXPECT_FALSE(fs::exists(dir / "out2"));
}

TEST(HfPretrained, ExportCopiesTheCheckpointsTokenizerFiles) {
  const fs::path dir = test::hf_test_dir();
  fs::create_directories(dir / "tok");
  std::ofstream(dir / "tok/vocab.json") << "{\"a\": 0}";
  std::ofstream(dir / "tok/merges.txt") << "#version: 0.2\n";
  // A checkpoint whose tokenizer_spec names GPT-2 BPE files (written directly: the
  // export only copies the files).
  const interop::HfModel hf = interop::load_hf_model(test::kHfFixtures / "hf_gpt2");
  train::TrainConfig config;
  config.model = hf.config;
  config.loop.seq = 16;
  ckpt::CheckpointState state;
  state.params = hf.params;
  state.opt_state = optim::Optimizer(config.optimizer_config(), models::Model(hf.config).specs()).init(hf.params);
  state.extra = {
      {"config", config.to_json()}, {"tokenizer", "bpe-test"}, {"tokenizer_spec", "gpt2:" + (dir / "tok").string()}};
  ckpt::CheckpointManager(dir / "run").save(state);
  train::export_hf(dir / "run", dir / "out", {}, [](const std::string&) {});
  EXPECT_EQ(test::read_text(dir / "out/vocab.json"), "{\"a\": 0}");
  EXPECT_EQ(test::read_text(dir / "out/merges.txt"), "#version: 0.2\n");
}

class HfInitFrom : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::hf_test_dir();
    test::write_tiny_corpus(dir_, 20000, 18000);
    // A pretrained GPT-2 in HF form whose vocabulary fits the byte-level corpus.
    hf_config_ = {.family = "gpt2", .vocab = 256, .dim = 32, .layers = 2, .heads = 4, .context = 32};
    hf_params_ = test::random_params(hf_config_, 21);
    interop::save_hf_model(dir_ / "hf", hf_config_, hf_params_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  train::TrainConfig config(int64_t steps) const {
    return train::parse_config(
        "", "test",
        {"model.family=\"llama\"", "model.dim=64", "model.heads=2", "model.context=64", "train.seq=16", "train.batch=2",
         "train.eval_batches=1", "train.log_interval=1", "optimizer.lr=1e-3", "run.threads=2", "run.seed=5",
         fmt::format("train.steps={}", steps), "data.train=\"" + (dir_ / "data/train.bin").string() + "\"",
         "data.val=\"" + (dir_ / "data/val.bin").string() + "\"", "run.dir=\"" + (dir_ / "run").string() + "\"",
         "run.init_from=\"" + (dir_ / "hf").string() + "\""});
  }

  fs::path dir_;
  models::ModelConfig hf_config_;
  Tree hf_params_;
};

TEST_F(HfInitFrom, FirstStepLossIsTheLossOfTheImportedWeights) {
  train::Trainer trainer(config(1), test::quiet_trainer());
  // The shape came from the HF directory, not from [model].
  EXPECT_EQ(trainer.config().model.family, "gpt2");
  EXPECT_EQ(trainer.config().model.dim, 32);
  EXPECT_EQ(trainer.config().model.context, 32);
  const train::TrainSummary summary = trainer.run();
  EXPECT_EQ(summary.start_step, 0);
  EXPECT_EQ(summary.end_step, 1);

  // The first batch the trainer drew, and the loss of the imported weights on it.
  auto file = std::make_shared<const data::TokenFile>(dir_ / "data/train.bin");
  data::DataLoader loader(file, 2, 16, 5);
  const data::Batch batch = loader.next();
  const double direct = models::Model(hf_config_).loss(hf_params_, batch.tokens, batch.targets).item<float>();
  EXPECT_NEAR(summary.last_loss, direct, 1e-5 * std::abs(direct)) << "the first step did not start from the weights";
  // A model from init(seed) has a clearly different loss (the check can fail).
  const double fresh =
      models::Model(hf_config_).loss(models::Model(hf_config_).init(5), batch.tokens, batch.targets).item<float>();
  EXPECT_GT(std::abs(fresh - direct), 1e-2);
}

TEST_F(HfInitFrom, TheRunsOwnCheckpointTakesPrecedence) {
  train::Trainer first(config(2), test::quiet_trainer(1));
  first.run();
  fs::remove_all(dir_ / "hf");  // resuming needs the run's checkpoint only
  train::Trainer second(config(2), test::quiet_trainer());
  const train::TrainSummary summary = second.run();
  EXPECT_EQ(summary.start_step, 1);
  EXPECT_EQ(summary.end_step, 2);
}

TEST(HfPretrained, InitFromShapeComesFromHfDirsCheckpointsAndRuns) {
  const fs::path dir = test::hf_test_dir();
  const train::ImportResult imported = train::import_hf(test::kHfFixtures / "hf_llama", dir / "run", collect);
  models::ModelConfig configured{.family = "gpt2", .dim = 64, .dropout = 0.1, .compute_dtype = "bfloat16"};
  for (const fs::path& source : {test::kHfFixtures / "hf_llama", imported.checkpoint, dir / "run"}) {
    const models::ModelConfig c = train::init_from_model_config(configured, source);
    EXPECT_EQ(c.family, "llama") << source;
    EXPECT_EQ(c.dim, 32) << source;
    EXPECT_EQ(c.resolved_kv_heads(), 2) << source;
    EXPECT_EQ(c.dropout, 0.1) << source;               // training choices stay
    EXPECT_EQ(c.compute_dtype, "bfloat16") << source;  // ...
  }
  const Tree from_run = train::load_init_params(dir / "run", imported.config, collect);
  test::expect_trees_bitwise_equal(from_run, interop::load_hf_model(test::kHfFixtures / "hf_llama").params);
  EXPECT_THROW(train::stored_model_config(dir / "nothing"), IOError);
}

TEST_F(HfInitFrom, ShapeMismatchWithAStoredModelIsAnError) {
  try {
    train::load_init_params(dir_ / "hf", {.family = "gpt2", .vocab = 256, .dim = 64, .layers = 2, .heads = 4}, collect);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a gpt2 vocab 256 dim 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
