// The export direction checked by transformers itself: tessera models with random
// (non-trivial) weights are exported, and tests/oracles/hf_check_export.py loads them
// with AutoModelForCausalLM and compares its logits with tessera's. Runs where
// .venv-oracles has transformers (tests/oracles/run_oracle.sh hf_models installs it);
// skips with a message elsewhere (CI never installs it).
#include <gtest/gtest.h>

#include <cstdlib>

#include "hf_test_util.h"
#include "tessera/interop/hf_checkpoint.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const fs::path kPython = test::kSourceDir / ".venv-oracles/bin/python";

bool venv_has_transformers() {
  const std::string probe = kPython.string() + " -c 'import transformers, torch' >/dev/null 2>&1";
  return fs::exists(kPython) && std::system(probe.c_str()) == 0;
}

// Exports a model with random weights to dir/model and writes tessera's logits of fixed
// tokens to dir/expected.json; returns the checker's arguments for it.
std::string export_with_logits(const models::ModelConfig& config, const fs::path& dir, uint64_t max_shard_bytes) {
  const Tree params = test::random_params(config, 17);
  interop::HfSaveOptions options;
  options.max_shard_bytes = max_shard_bytes;
  interop::save_hf_model(dir / "model", config, params, options);
  const std::vector<int32_t> ids{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  const Array tokens = Array::from_vector(ids, {2, 6});
  const Array logits = models::Model(config).logits(params, tokens).eval();
  nlohmann::json expected = {
      {"tokens",
       {std::vector<int32_t>(ids.begin(), ids.begin() + 6), std::vector<int32_t>(ids.begin() + 6, ids.end())}},
      {"shape", logits.shape()},
      {"logits", logits.to_vector<float>()}};
  std::ofstream(dir / "expected.json") << expected.dump();
  return " " + (dir / "model").string() + " " + (dir / "expected.json").string();
}

TEST(HfExportLive, TransformersLoadsExportedGpt2LlamaAndMixtralWithTesserasLogits) {
  if (!venv_has_transformers())
    GTEST_SKIP() << "no transformers in " << kPython << " (run tests/oracles/run_oracle.sh hf_models to install it)";
  const fs::path dir = test::hf_test_dir();
  std::string pairs;
  pairs += export_with_logits({.family = "gpt2", .vocab = 64, .dim = 48, .layers = 2, .heads = 4, .context = 16},
                              dir / "gpt2", 5'000'000'000);
  pairs += export_with_logits({.family = "llama",
                               .vocab = 64,
                               .dim = 48,
                               .layers = 2,
                               .heads = 6,
                               .kv_heads = 2,
                               .mlp_dim = 80,
                               .context = 16,
                               .rope_theta = 1000.0},
                              dir / "llama", 20'000);  // sharded
  models::ModelConfig tied{.family = "llama", .vocab = 64, .dim = 32, .layers = 1, .heads = 4, .context = 16};
  tied.tied_embeddings = true;
  pairs += export_with_logits(tied, dir / "llama_tied", 5'000'000'000);
  // Llama 3.1 RoPE scaling, its pretraining context short enough that head_dim 16 has
  // frequencies in all three bands (wavelengths 6.3 < 32/4 < 19.9 < 32/1 < 62.8 ...).
  models::ModelConfig llama31{.family = "llama", .vocab = 64, .dim = 32, .layers = 2, .heads = 2, .context = 64};
  llama31.rope_scaling = "llama3";
  llama31.rope_original_context = 32;
  pairs += export_with_logits(llama31, dir / "llama31", 5'000'000'000);
  // Mixtral: 4 experts, 2 per token (transformers' dropless routing on tessera's weights).
  models::ModelConfig mixtral = models::preset("mixtral-tiny");
  mixtral.vocab = 64;
  mixtral.dim = 32;
  mixtral.mlp_dim = 40;
  mixtral.context = 16;
  pairs += export_with_logits(mixtral, dir / "mixtral", 5'000'000'000);
  // Same float32 reasoning as test_hf_import.cpp: only the summation order differs.
  const std::string command =
      kPython.string() + " " + (test::kSourceDir / "tests/oracles/hf_check_export.py").string() + pairs + " --tol 5e-5";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
