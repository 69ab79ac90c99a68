// int8 (AQT) training in the trainer: the [quant] keys (defaults, validation naming the
// key, the checkpoint-manifest round trip); a run with every matmul in int8, forward and
// backward, learns like bfloat16 and resumes bitwise (the stochastic rounding follows
// the step's key); the straight-through variant needs no key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/kernels/matmul_int8.h"
#include "core/test_util.h"
#include "tessera/base/error.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/events.h"
#include "tessera/train/trainer.h"
#include "train/tiny_corpus.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

void expect_config_error(const std::vector<std::string>& overrides, const std::vector<std::string>& parts) {
  try {
    parse_config("", "test", overrides);
    ADD_FAILURE() << "no error for " << overrides.back();
  } catch (const ConfigError& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what() << "\nlacks: " << part;
  }
}

TEST(Int8Config, QuantKeys) {
  const TrainConfig plain = parse_config("", "test");
  EXPECT_TRUE(plain.model.quant_targets.empty());
  EXPECT_FALSE(plain.model.needs_step_key());
  const TrainConfig c =
      parse_config("[quant]\ntargets = [\"attention\", \"mlp\", \"head\"]\nbackward = \"int8\"\n", "x.toml");
  EXPECT_EQ(c.model.quant_targets, (std::vector<std::string>{"attention", "mlp", "head"}));
  EXPECT_TRUE(c.model.quantized("head"));
  EXPECT_TRUE(c.model.needs_step_key()) << "int8 backward GEMMs round stochastically";
  EXPECT_FALSE(parse_config("", "test", {"quant.targets=[\"mlp\"]", "quant.backward=float"}).model.needs_step_key());
  expect_config_error({"quant.targets=[\"attn\"]"}, {"quant target 'attn'", "quant.targets", "'attention', 'mlp'"});
  expect_config_error({"quant.targets=[\"mlp\", \"mlp\"]"}, {"'mlp' is listed twice"});
  expect_config_error({"quant.targets=[\"mlp\"]", "quant.backward=fp8"},
                      {"quant.backward = 'fp8'", "'int8' or 'float'"});
  expect_config_error({"quant.targets=[\"mlp\"]", "model.compute_dtype=float16"},
                      {"quant.targets", "float32 or bfloat16", "float16"});
  expect_config_error({"quant.target=[\"mlp\"]"}, {"unknown key 'quant.target'", "quant.targets"});
}

// mode "auto": int8 only on a CPU with int8 units (AMX-INT8, AVX512-VNNI), otherwise the
// targets are dropped.
TEST(Int8Config, AutoModeFollowsTheMachine) {
  const TrainConfig c = parse_config("", "test", {"quant.targets=[\"mlp\"]", "quant.mode=auto"});
  if (cpu::int8_gemm_path().native) {
    EXPECT_EQ(c.model.quant_targets, std::vector<std::string>{"mlp"});
  } else {
    EXPECT_TRUE(c.model.quant_targets.empty()) << cpu::int8_gemm_path().description;
  }
  EXPECT_TRUE(parse_config("", "test", {"quant.targets=[\"mlp\"]", "quant.mode=auto", "run.device=cuda"})
                  .model.quant_targets.empty())
      << "no int8 kernel on GPUs";
  EXPECT_EQ(parse_config("", "test", {"quant.targets=[\"mlp\"]", "quant.mode=on"}).model.quant_targets,
            std::vector<std::string>{"mlp"});
  expect_config_error({"quant.mode=sometimes"}, {"'quant.mode'", "on or auto"});
}

TEST(Int8Config, ManifestRoundTrip) {
  const TrainConfig c = parse_config("", "test", {"quant.targets=[\"attention\", \"head\"]", "quant.backward=float"});
  const nlohmann::json json = c.to_json();
  const TrainConfig back = config_from_json(json);
  EXPECT_EQ(back.to_json(), json);
  EXPECT_EQ(back.model.quant_targets, c.model.quant_targets);
  EXPECT_EQ(back.model.quant_backward, "float");
}

class Int8Trainer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("tessera_int8_");
    test::write_tiny_corpus(dir_, 40000, 36000);
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::string& run, const std::vector<std::string>& extra) const {
    std::vector<std::string> overrides = {"model.family=\"gpt2\"",
                                          "model.vocab=256",
                                          "model.dim=64",
                                          "model.layers=2",
                                          "model.heads=2",
                                          "model.context=32",
                                          "model.compute_dtype=bfloat16",
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

  fs::path dir_;
};

void expect_bitwise_equal(const Tree& a, const Tree& b, const std::string& what) {
  ASSERT_TRUE(a.same_structure(b)) << what;
  std::vector<Array> x = a.leaves(), y = b.leaves();
  eval(x);
  eval(y);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].nbytes(), y[i].nbytes()) << what;
    EXPECT_EQ(std::memcmp(x[i].raw_data(), y[i].raw_data(), x[i].nbytes()), 0) << what << " leaf " << i << " differs";
  }
}

const std::vector<std::string> kAllInt8 = {"quant.targets=[\"attention\", \"mlp\", \"head\"]", "quant.backward=int8"};

TEST_F(Int8Trainer, AllInt8RunLearnsLikeBfloat16) {
  std::vector<std::string> int8 = kAllInt8;
  int8.push_back("train.steps=30");
  const TrainSummary q = Trainer(config("int8", int8), test::quiet_trainer()).run();
  const TrainSummary b = Trainer(config("bf16", {"train.steps=30"}), test::quiet_trainer()).run();
  ASSERT_TRUE(q.val_loss.has_value() && b.val_loss.has_value());
  EXPECT_LT(*q.val_loss, 0.7 * std::log(256.0));
  EXPECT_NEAR(*q.val_loss, *b.val_loss, 0.05 * *b.val_loss) << "int8 " << *q.val_loss << " vs bf16 " << *b.val_loss;
  EXPECT_NE(*q.val_loss, *b.val_loss) << "the int8 run computed exactly what bf16 did";
}

// The goodput report's MFU counts what the run summary's does: the model's FLOPs over the
// same peak, which for an int8 run mixes the int8 GEMM's rate into the compute dtype's
// (it once divided the compiled step's FLOPs, optimizer included, by the bf16 rate alone).
TEST_F(Int8Trainer, GoodputMfuUsesTheSummarysModelFlopsAndPeak) {
  std::vector<std::string> int8 = kAllInt8;
  int8.push_back("train.steps=6");
  const TrainSummary s = Trainer(config("mfu", int8), test::quiet_trainer()).run();
  ASSERT_GT(s.peak_flops, 0);
  ASSERT_GT(s.tokens_per_s, 0);
  EXPECT_NE(s.peak_source.find("mixed with the int8"), std::string::npos) << s.peak_source;
  const goodput::GoodputReport r =
      goodput::compute_goodput(goodput::read_event_log(goodput::event_log_path(dir_ / "mfu")));
  EXPECT_NEAR(r.peak_flops, s.peak_flops, 1e-9 * s.peak_flops);
  const double flops_per_token = s.mfu * s.peak_flops / s.tokens_per_s;
  EXPECT_NEAR(r.model_flops, static_cast<double>(r.kept_steps) * 4 * 32 * flops_per_token, 1e-6 * r.model_flops);
  EXPECT_EQ(r.kept_steps, 6);
}

TEST_F(Int8Trainer, ResumesBitwise) {
  std::vector<std::string> extra = kAllInt8;
  extra.insert(extra.end(), {"train.steps=6", "checkpoint.interval=3"});
  Trainer straight(config("straight", extra), test::quiet_trainer());
  straight.run();
  Trainer first(config("resumed", extra), test::quiet_trainer(/*stop_at=*/3));
  EXPECT_EQ(first.run().end_step, 3);
  Trainer second(config("resumed", extra), test::quiet_trainer());
  EXPECT_EQ(second.run().start_step, 3);
  expect_bitwise_equal(straight.params(), second.params(), "params");
  expect_bitwise_equal(straight.opt_state(), second.opt_state(), "opt state");
}

TEST_F(Int8Trainer, ForwardOnlyNeedsNoKeyAndLearns) {
  const TrainSummary s = Trainer(config("fwd", {"quant.targets=[\"mlp\"]", "quant.backward=float", "train.steps=20"}),
                                 test::quiet_trainer())
                             .run();
  ASSERT_TRUE(s.val_loss.has_value());
  EXPECT_LT(*s.val_loss, 0.8 * std::log(256.0));
}

}  // namespace
}  // namespace tessera::train
