// Mixed precision in the trainer: the model.compute_dtype and optimizer.loss_scale
// keys (validation, "auto" resolution, checkpoint-manifest round trip); the compiled
// step in float16 with dynamic loss scaling skips an overflowing step (params,
// moments and step count bitwise unchanged, the scale halved) with one micro-batch
// and with several; a float16 run with a growing scale resumes bitwise; a bfloat16
// run learns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/kernels/cpu_isa.h"
#include "backend/cpu/kernels/matmul.h"
#include "core/test_util.h"
#include "tessera/base/error.h"
#include "tessera/core/ops.h"
#include "tessera/train/train_step.h"
#include "tessera/train/trainer.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using optim::LossScaling;

void expect_bitwise_equal(const Tree& a, const Tree& b, const std::string& what) {
  ASSERT_TRUE(a.same_structure(b)) << what;
  std::vector<Array> x = a.leaves(), y = b.leaves();
  eval(x);
  eval(y);
  const std::vector<std::string> paths = a.paths();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].dtype(), y[i].dtype()) << what << " " << paths[i];
    ASSERT_EQ(x[i].nbytes(), y[i].nbytes()) << what << " " << paths[i];
    EXPECT_EQ(std::memcmp(x[i].raw_data(), y[i].raw_data(), x[i].nbytes()), 0) << what << " " << paths[i] << " differs";
  }
}

Tree copy_tree(const Tree& t) {
  return t.map([](const Array& a) {
    Array e = a.eval();
    return Array::from_data(e.raw_data(), e.shape(), e.dtype());
  });
}

void expect_config_error(const std::vector<std::string>& overrides, const std::vector<std::string>& parts) {
  try {
    parse_config("", "test", overrides);
    ADD_FAILURE() << "no error for " << overrides.back();
  } catch (const ConfigError& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what() << "\nlacks: " << part;
  }
}

TEST(MixedPrecisionConfig, ComputeDtypeKey) {
  EXPECT_EQ(parse_config("", "test").model.compute_dtype, "float32");
  EXPECT_EQ(parse_config("[model]\ncompute_dtype = \"bfloat16\"\n", "x.toml").model.compute_dtype, "bfloat16");
  EXPECT_EQ(parse_config("", "test", {"model.compute_dtype=float16"}).model.compute_dtype, "float16");
  expect_config_error({"model.compute_dtype=bf16"},
                      {"--set model.compute_dtype=bf16", "'model.compute_dtype'", "float32, bfloat16, float16, auto"});
  try {
    parse_config("[model]\nlayers = 2\ncompute_dtype = \"half\"\n", "x.toml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("x.toml:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.compute_dtype"), std::string::npos) << e.what();
  }
  expect_config_error({"model.compute_dtype=3"}, {"model.compute_dtype", "a string"});
  // Set programmatically: validate() names the key too.
  TrainConfig c;
  c.model.compute_dtype = "fp8";
  try {
    c.validate();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.compute_dtype'"), std::string::npos) << e.what();
  }
}

// "auto" resolves when the config is read: bf16 where the CPU's bf16 GEMMs beat float32
// (AMX; AVX512-BF16 on AMD, not on Intel) or on a GPU, float32 elsewhere; the resolved
// dtype is what the manifest keeps.
TEST(MixedPrecisionConfig, AutoComputeDtypeFollowsTheMachine) {
  const cpu::Bf16GemmPath& path = cpu::bf16_gemm_path();
  const bool amd = cpu::x86_isa().amd;
  EXPECT_EQ(path.faster_than_float32,
            path.kernel == cpu::Bf16Kernel::Amx || (path.kernel == cpu::Bf16Kernel::Avx512Bf16 && amd))
      << path.description;
  const std::string cpu = path.faster_than_float32 ? "bfloat16" : "float32";
  const TrainConfig c = parse_config("[model]\ncompute_dtype = \"auto\"\n", "x.toml");
  EXPECT_EQ(c.model.compute_dtype, cpu);
  EXPECT_EQ(c.to_json()["model"]["compute_dtype"], cpu);
  EXPECT_EQ(parse_config("", "test", {"model.compute_dtype=auto", "run.device=cuda"}).model.compute_dtype, "bfloat16");
  TrainConfig programmatic;
  programmatic.model.compute_dtype = "auto";
  EXPECT_NO_THROW(programmatic.validate());
}

TEST(MixedPrecisionConfig, LossScaleKeyAndAutoResolution) {
  auto resolved = [](const std::vector<std::string>& overrides) {
    return parse_config("", "test", overrides).optimizer_config().loss_scale;
  };
  EXPECT_EQ(parse_config("", "test").optimizer.loss_scale.mode, LossScaling::Auto);
  EXPECT_EQ(resolved({}).mode, LossScaling::Off);
  EXPECT_EQ(resolved({"model.compute_dtype=bfloat16"}).mode, LossScaling::Off);
  EXPECT_EQ(resolved({"model.compute_dtype=float16"}).mode, LossScaling::Dynamic);
  EXPECT_EQ(resolved({"model.compute_dtype=float16", "optimizer.loss_scale=\"none\""}).mode, LossScaling::Off);
  EXPECT_EQ(resolved({"model.compute_dtype=float16", "optimizer.loss_scale=0"}).mode, LossScaling::Off);
  EXPECT_EQ(resolved({"optimizer.loss_scale=dynamic"}).mode, LossScaling::Dynamic);
  const optim::LossScaleConfig fixed = resolved({"optimizer.loss_scale=1024"});
  EXPECT_EQ(fixed.mode, LossScaling::Static);
  EXPECT_EQ(fixed.static_scale, 1024.0);
  const optim::LossScaleConfig tuned = resolved(
      {"optimizer.loss_scale=dynamic", "optimizer.loss_scale_init=1024", "optimizer.loss_scale_growth_interval=7",
       "optimizer.loss_scale_growth_factor=4", "optimizer.loss_scale_backoff_factor=0.25"});
  EXPECT_EQ(tuned.init_scale, 1024.0);
  EXPECT_EQ(tuned.growth_interval, 7);
  EXPECT_EQ(tuned.growth_factor, 4.0);
  EXPECT_EQ(tuned.backoff_factor, 0.25);
  // PyTorch GradScaler's defaults.
  const optim::LossScaleConfig defaults = resolved({"model.compute_dtype=float16"});
  EXPECT_EQ(defaults.init_scale, 65536.0);
  EXPECT_EQ(defaults.growth_interval, 2000);
  EXPECT_EQ(defaults.growth_factor, 2.0);
  EXPECT_EQ(defaults.backoff_factor, 0.5);

  expect_config_error({"optimizer.loss_scale=sometimes"}, {"optimizer.loss_scale", "sometimes", "auto, dynamic, none"});
  expect_config_error({"optimizer.loss_scale=-1"}, {"optimizer.loss_scale", "-1"});
  expect_config_error({"optimizer.loss_scale=true"}, {"optimizer.loss_scale"});
  expect_config_error({"optimizer.loss_scale_growth_interval=0"}, {"loss_scale_growth_interval"});
  expect_config_error({"optimizer.loss_scale_backoff_factor=1"}, {"loss_scale_backoff_factor"});
  expect_config_error({"optimizer.loss_scal=dynamic"}, {"did you mean 'optimizer.loss_scale'"});
}

TEST(MixedPrecisionConfig, ManifestRoundTrip) {
  for (const std::vector<std::string>& overrides :
       std::vector<std::vector<std::string>>{{"model.compute_dtype=bfloat16"},
                                             {"model.compute_dtype=float16", "optimizer.loss_scale_growth_interval=5"},
                                             {"model.compute_dtype=float16", "optimizer.loss_scale=none"},
                                             {"optimizer.loss_scale=512"},
                                             {"optimizer.loss_scale=dynamic", "optimizer.loss_scale_init=256"}}) {
    const TrainConfig c = parse_config("", "test", overrides);
    const nlohmann::json json = c.to_json();
    const TrainConfig back = config_from_json(json);
    EXPECT_EQ(back.to_json(), json) << overrides.back();
    EXPECT_EQ(back.model.compute_dtype, c.model.compute_dtype);
    EXPECT_EQ(back.optimizer.loss_scale.mode, c.optimizer.loss_scale.mode) << overrides.back();
    EXPECT_EQ(back.optimizer_config().loss_scale.initial(), c.optimizer_config().loss_scale.initial());
  }
  EXPECT_EQ(parse_config("", "test", {"optimizer.loss_scale=512"}).to_json()["optimizer"]["loss_scale"], 512.0);
  EXPECT_EQ(parse_config("", "test").to_json()["optimizer"]["loss_scale"], "auto");
  EXPECT_EQ(parse_config("", "test").to_json()["model"]["compute_dtype"], "float32");
  // A manifest written before these keys existed: float32, no loss scaling.
  nlohmann::json old = parse_config("", "test").to_json();
  old["model"].erase("compute_dtype");
  for (const char* key : {"loss_scale", "loss_scale_init", "loss_scale_growth_interval", "loss_scale_growth_factor",
                          "loss_scale_backoff_factor"})
    old["optimizer"].erase(key);
  const TrainConfig legacy = config_from_json(old);
  EXPECT_EQ(legacy.model.compute_dtype, "float32");
  EXPECT_EQ(legacy.optimizer_config().loss_scale.mode, LossScaling::Off);
}

// ---- the compiled step in float16 with dynamic loss scaling ----

data::Batch random_batch(int64_t b, int64_t t, uint32_t seed) {
  auto ids = [&](uint32_t s) {
    std::vector<int64_t> v = test::random_ints(b * t, s, 0, 63);
    return Array::from_vector(std::vector<int32_t>(v.begin(), v.end()), {b, t});
  };
  return {ids(seed), ids(seed + 1)};
}

Tree without_loss_scale(const Tree& state) {
  Tree out;
  for (const auto& [key, value] : state.items())
    if (key != "loss_scale") out[key] = value;
  return out;
}

void check_overflow_skips(int64_t micro_batches) {
  SCOPED_TRACE("micro_batches " + std::to_string(micro_batches));
  models::Model model(test::tiny_gpt_config("float16"));
  optim::OptimizerConfig oc;
  oc.loss_scale.mode = LossScaling::Dynamic;
  optim::Optimizer optimizer(oc, model.specs());
  Tree params = model.init(3);
  Tree state = optimizer.init(params);
  TrainStep step(model, optimizer, micro_batches);
  std::vector<data::Batch> micro;
  for (int64_t i = 0; i < micro_batches; ++i) micro.push_back(random_batch(2, 16, 10 + static_cast<uint32_t>(i)));

  // A good step: applied, scale kept, one good step counted.
  const StepStats first = step.run(params, state, micro, 1e-3, std::nullopt);
  EXPECT_FALSE(first.skipped);
  EXPECT_EQ(first.loss_scale, 65536.0);
  EXPECT_TRUE(std::isfinite(first.loss));
  EXPECT_NEAR(first.loss, std::log(64.0), 0.2) << "the loss reported is unscaled";
  EXPECT_EQ(state.at("step").leaf().item<int64_t>(), 1);
  EXPECT_EQ(state.at("loss_scale").at("good_steps").leaf().item<int64_t>(), 1);
  for (const Array& p : params.leaves()) EXPECT_EQ(p.dtype(), DType::Float32);

  // Inject an overflow: a scale whose float16 gradients are infinite.
  state["loss_scale"]["scale"] = Array::scalar(3e38, DType::Float32);
  const Tree params_before = copy_tree(params), state_before = copy_tree(state);
  const StepStats skipped = step.run(params, state, micro, 1e-3, std::nullopt);
  EXPECT_TRUE(skipped.skipped);
  EXPECT_TRUE(std::isfinite(skipped.loss)) << "the loss itself is finite; its gradients are not";
  EXPECT_FALSE(std::isfinite(skipped.grad_norm));
  EXPECT_EQ(skipped.loss_scale, static_cast<double>(3e38f) * 0.5);
  expect_bitwise_equal(params, params_before, "params after a skipped step");
  expect_bitwise_equal(without_loss_scale(state), without_loss_scale(state_before), "moments and step");
  EXPECT_EQ(state.at("step").leaf().item<int64_t>(), 1) << "the step count does not advance";
  EXPECT_EQ(state.at("loss_scale").at("good_steps").leaf().item<int64_t>(), 0);

  // Back to a sane scale: the next step applies.
  state["loss_scale"]["scale"] = Array::scalar(1024, DType::Float32);
  const StepStats after = step.run(params, state, micro, 1e-3, std::nullopt);
  EXPECT_FALSE(after.skipped);
  EXPECT_EQ(state.at("step").leaf().item<int64_t>(), 2);
  EXPECT_EQ(step.trace_count(), micro_batches == 1 ? 1 : 3);
}

TEST(MixedPrecisionStep, Fp16OverflowSkipsTheStep) { check_overflow_skips(1); }

TEST(MixedPrecisionStep, Fp16OverflowSkipsTheStepWithMicroBatches) { check_overflow_skips(2); }

// Scaled float16 gradients, unscaled, are float16 gradients: the step with loss
// scaling tracks the float32 step's loss.
TEST(MixedPrecisionStep, Fp16WithLossScalingTracksFloat32) {
  auto losses = [](const std::string& dtype) {
    models::Model model(test::tiny_gpt_config(dtype));
    optim::OptimizerConfig oc;
    if (dtype == "float16") oc.loss_scale.mode = LossScaling::Dynamic;
    optim::Optimizer optimizer(oc, model.specs());
    Tree params = model.init(4), state = optimizer.init(params);
    TrainStep step(model, optimizer, 1);
    const data::Batch batch = random_batch(4, 16, 20);
    std::vector<double> out;
    for (int i = 0; i < 8; ++i) out.push_back(step.run(params, state, {batch}, 3e-3, std::nullopt).loss);
    return out;
  };
  const std::vector<double> want = losses("float32"), got = losses("float16");
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 5e-3 * want[i]) << "step " << i;
  EXPECT_LT(got.back(), 0.9 * got.front());
}

// ---- the trainer ----

class MixedPrecisionTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("tessera_mixed_");
    test::write_tiny_corpus(dir_, 40000, 36000);
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::string& run, const std::vector<std::string>& extra) const {
    std::vector<std::string> overrides = {"model.family=\"gpt2\"",
                                          "model.vocab=256",
                                          "model.dim=32",
                                          "model.layers=2",
                                          "model.heads=2",
                                          "model.context=32",
                                          "train.seq=32",
                                          "train.batch=4",
                                          "train.eval_batches=2",
                                          "train.log_interval=1",
                                          "schedule.warmup_steps=2",
                                          "optimizer.lr=3e-3",
                                          "run.threads=2",
                                          "run.seed=11",
                                          "data.train=\"" + (dir_ / "data/train.bin").string() + "\"",
                                          "data.val=\"" + (dir_ / "data/val.bin").string() + "\"",
                                          "run.dir=\"" + (dir_ / run).string() + "\""};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return parse_config("", "test", overrides);
  }

  static TrainerOptions quiet(int64_t stop_at = 0) { return test::quiet_trainer(stop_at); }

  fs::path dir_;
};

TEST_F(MixedPrecisionTrainer, Fp16WithDynamicScalingResumesBitwise) {
  // A growth interval of 2, so the scale changes during the run and must be restored.
  const std::vector<std::string> extra = {"model.compute_dtype=float16", "optimizer.loss_scale_growth_interval=2",
                                          "train.steps=6", "checkpoint.interval=2"};
  Trainer straight(config("straight", extra), quiet());
  straight.run();
  const Tree& state = straight.opt_state();
  ASSERT_TRUE(state.items().contains("loss_scale"));
  const double scale = state.at("loss_scale").at("scale").leaf().item<double>();
  EXPECT_NE(scale, 65536.0) << "the scale never changed";
  EXPECT_EQ(std::exp2(std::round(std::log2(scale))), scale) << "a power of two: grown or backed off from 2^16";

  Trainer first(config("resumed", extra), quiet(/*stop_at=*/3));
  EXPECT_EQ(first.run().end_step, 3);
  Trainer second(config("resumed", extra), quiet());
  EXPECT_EQ(second.run().start_step, 3);
  expect_bitwise_equal(straight.params(), second.params(), "params");
  expect_bitwise_equal(straight.opt_state(), second.opt_state(), "opt state");

  // metrics.jsonl records the scale and whether each step was skipped.
  std::ifstream metrics(dir_ / "straight/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const nlohmann::json record = nlohmann::json::parse(line);
  EXPECT_TRUE(record.contains("loss_scale")) << line;
  EXPECT_TRUE(record.contains("skipped")) << line;
}

TEST_F(MixedPrecisionTrainer, Bf16RunLearns) {
  Trainer trainer(config("run", {"model.compute_dtype=bfloat16", "train.steps=30"}), quiet());
  const TrainSummary s = trainer.run();
  EXPECT_EQ(s.end_step, 30);
  ASSERT_TRUE(s.val_loss.has_value());
  EXPECT_LT(*s.val_loss, 0.7 * std::log(256.0));
  EXPECT_FALSE(trainer.opt_state().items().contains("loss_scale"));
  for (const Array& p : trainer.params().leaves()) EXPECT_EQ(p.dtype(), DType::Float32);
}

}  // namespace
}  // namespace tessera::train
