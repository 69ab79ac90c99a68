// Evaluation through a pipeline's stages (PipelineTrainStep::evaluate: the schedule's
// forwards alone) against one device's Evaluator on the same parameters: GPT-2 and Llama,
// replicas, interleaved stages, stages partitioned over tensor and FSDP axes, and models
// with dropout (whose evaluation forwards run without the step key, so without dropout).
// The multi-process case (stage-local parameters) is in tests/spmd/multiprocess/train_main.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "spmd/parallel_train_util.h"
#include "spmd/spmd_test_util.h"
#include "tessera/data/loader.h"
#include "tessera/data/token_file.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/pipeline_step.h"
#include "tessera/train/train_step.h"
#include "train/pipeline_test_util.h"

namespace tessera::train {
namespace {

constexpr int64_t kBatch = testing::kPipelineBatch, kSeq = testing::kPipelineSeq;

// A validation file of random tokens (3 batches), removed with the object.
struct ValidationFile {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("tessera_pipeline_eval_" + std::to_string(getpid()) + ".bin");
  ValidationFile() {
    std::vector<int32_t> tokens(static_cast<size_t>(3 * kBatch * (kSeq + 1)));
    std::mt19937 rng(5);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 64);
    data::write_token_file(path, tokens, "byte", 256);
  }
  ~ValidationFile() { std::filesystem::remove(path); }
  data::DataLoader loader() const {
    return data::DataLoader(std::make_shared<const data::TokenFile>(path), kBatch, kSeq, 1, 0, 1, /*shuffle=*/false);
  }
};

struct EvalCase {
  std::string mesh;  // "" : threads without partitioned stages
  PipelineKind kind;
  int micro_batches, virtual_stages, replicas;
};

TEST(PipelineEvaluate, EqualsOneDeviceForEveryLayoutWithAndWithoutDropout) {
  testing::VirtualDevices devices(8);
  const ValidationFile file;
  for (const std::string family : {"gpt2", "llama"})
    for (const double dropout : {0.0, 0.1}) {
      models::ModelConfig c = testing::pipeline_test_model(family);
      c.dropout = dropout;
      const models::Model model(c);
      const optim::Optimizer optimizer(testing::test_adamw(), model.specs());
      const Tree params = model.init(3);
      data::DataLoader one_loader = file.loader();
      const double want = Evaluator(model)(params, one_loader, 2);
      for (const EvalCase& e :
           {EvalCase{"", PipelineKind::kOneFOneB, 4, 1, 1}, EvalCase{"", PipelineKind::kGPipe, 2, 1, 2},
            EvalCase{"", PipelineKind::kInterleaved, 4, 2, 1},
            EvalCase{"pipeline=2,tensor=2", PipelineKind::kOneFOneB, 2, 1, 1},
            EvalCase{"pipeline=2,fsdp=2", PipelineKind::kGPipe, 2, 1, 1}}) {
        const std::string what = fmt::format("{} dropout {} {} {} m={} v={} replicas={}", family, dropout, e.mesh,
                                             to_string(e.kind), e.micro_batches, e.virtual_stages, e.replicas);
        PipelineTrainStep pipe(model, optimizer, 1,
                               testing::pipeline_options(e.kind, 2, e.micro_batches, e.virtual_stages, e.mesh),
                               e.replicas, kSeq);
        data::DataLoader loader = file.loader();
        const double got = pipe.evaluate(params, loader, 2);
        std::printf("%-64s validation loss %.7f (one device %.7f)\n", what.c_str(), got, want);
        EXPECT_LT(std::abs(got - want) / want, 1e-6) << what;
        // Twice the same value: the loader restarts, the forwards draw nothing at random.
        EXPECT_EQ(pipe.evaluate(params, loader, 2), got) << what;
      }
    }
}

// A mixture of experts: each micro-batch's stages hand on their routing figures, and
// evaluation takes the load-balancing term of the whole batch's figures (over the
// replicas' micro-batches too), as one device's Evaluator does over the batch.
TEST(PipelineEvaluate, MixtureOfExpertsTakesTheWholeBatchsLoadBalancingTerm) {
  testing::VirtualDevices devices(8);
  const ValidationFile file;
  models::ModelConfig c = testing::pipeline_test_model("llama");
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_loss_coef = 0.5;  // a term that shows
  const models::Model model(c);
  const optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  const Tree params = model.init(3);
  data::DataLoader one_loader = file.loader();
  const double want = Evaluator(model)(params, one_loader, 2);
  // Each micro-batch's own term instead gives another figure (the mean of products is not
  // the product of means; 2e-5 to 5e-5 relative here), which the 1e-6 bar tells apart.
  models::ModelConfig plain = c;
  plain.moe_aux_loss_coef = 0;
  data::DataLoader plain_loader = file.loader();
  const double cross_entropy = Evaluator(models::Model(plain))(params, plain_loader, 2);
  ASSERT_GT(want - cross_entropy, 0.1);
  for (const EvalCase& e : {EvalCase{"", PipelineKind::kOneFOneB, 4, 1, 1}, EvalCase{"", PipelineKind::kGPipe, 2, 1, 2},
                            EvalCase{"", PipelineKind::kInterleaved, 2, 2, 1},
                            EvalCase{"pipeline=2,expert=2", PipelineKind::kOneFOneB, 2, 1, 1},
                            EvalCase{"pipeline=2,tensor=2", PipelineKind::kGPipe, 2, 1, 1}}) {
    const std::string what = fmt::format("moe {} {} m={} v={} replicas={}", e.mesh, to_string(e.kind), e.micro_batches,
                                         e.virtual_stages, e.replicas);
    PipelineTrainStep pipe(model, optimizer, 1,
                           testing::pipeline_options(e.kind, 2, e.micro_batches, e.virtual_stages, e.mesh), e.replicas,
                           kSeq);
    data::DataLoader loader = file.loader();
    const double got = pipe.evaluate(params, loader, 2);
    std::printf("%-64s validation loss %.7f (one device %.7f; cross-entropy alone %.7f)\n", what.c_str(), got, want,
                cross_entropy);
    EXPECT_LT(std::abs(got - want) / want, 1e-6) << what;
  }
}

TEST(PipelineEvaluate, BadBatchCountsAreClearErrors) {
  const ValidationFile file;
  const models::Model model(testing::pipeline_test_model("gpt2"));
  const optim::Optimizer optimizer(testing::test_adamw(), model.specs());
  PipelineTrainStep pipe(model, optimizer, 1, PipelineOptions{}, 1, kSeq);
  data::DataLoader loader = file.loader();
  try {
    pipe.evaluate(model.init(3), loader, 0);
    ADD_FAILURE() << "0 batches should be an error";
  } catch (const ValueError& error) {
    EXPECT_NE(std::string(error.what()).find("batches must be >= 1"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tessera::train
