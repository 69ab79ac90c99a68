// Writes the binary seed corpora of fuzz/corpus/ with tessera's own writers, so the seeds
// are what the programs really produce (docs/fuzzing.md). Built in the fuzz tree as
// `fuzz_make_seeds`; run from anywhere: `build-fuzz/bin/fuzz_make_seeds fuzz/corpus`.
// Text seeds (configs, tokenizer files) are copies from the repo (docs/fuzzing.md, Seeds).
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "fuzz_cache_keys.h"
#include "fuzz_util.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/compiler/compile.h"
#include "tessera/compiler/executable.h"
#include "tessera/compiler/parser.h"
#include "tessera/data/token_file.h"
#include "tessera/goodput/recorder.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/interop/hf_config.h"
#include "tessera/models/model.h"
#include "tessera/tessera.h"
#include "tessera/train/config.h"
#include "tessera/train/tensorboard.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void put(const fs::path& corpus, const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(corpus / target);
  fuzz::write_file(corpus / target / name, bytes);
  fmt::print("{}/{}: {} bytes\n", target, name, bytes.size());
}

models::ModelConfig tiny_model(const std::string& family) {
  models::ModelConfig c;
  c.family = family;
  c.vocab = 16;
  c.dim = 8;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = family == "llama" ? 1 : 0;
  c.mlp_dim = 16;
  c.context = 8;
  return c;
}

void token_files(const fs::path& corpus, const fs::path& scratch) {
  data::write_token_file(scratch / "narrow.bin", {0, 1, 2, 255, 65535}, "byte", 65536);
  put(corpus, "token_file", "narrow.bin", read_all(scratch / "narrow.bin"));
  data::write_token_file(scratch / "wide.bin", {5, 70000, 3}, "gpt2:1f2e3d", 100000);
  put(corpus, "token_file", "wide.bin", read_all(scratch / "wide.bin"));
}

void safetensors(const fs::path& corpus, const fs::path& scratch) {
  std::map<std::string, Array> tensors;
  tensors["w"] = zeros({2, 3}, DType::Float32);
  tensors["b"] = zeros({3}, DType::BFloat16);
  tensors["mask"] = zeros({4}, DType::Bool);
  tensors["ids"] = zeros({2}, DType::Int64);
  tensors["empty"] = zeros({0, 5}, DType::Float16);
  ckpt::write_safetensors(scratch / "a.safetensors", tensors, {{"format", "pt"}});
  put(corpus, "safetensors", "mixed.safetensors", read_all(scratch / "a.safetensors"));
}

void hf_models(const fs::path& corpus, const fs::path& scratch) {
  for (const std::string family : {"gpt2", "llama"}) {
    const models::ModelConfig config = tiny_model(family);
    const fs::path dir = scratch / ("hf-" + family);
    interop::save_hf_model(dir, config, models::Model(config).init(1));
    const std::string json = read_all(dir / "config.json");
    put(corpus, "hf_config", family + ".json", json);
    put(corpus, "hf_weights", family, json + std::string(1, '\0') + read_all(dir / "model.safetensors"));
  }
}

void checkpoint(const fs::path& corpus, const fs::path& scratch) {
  train::TrainConfig config = train::parse_config("[model]\npreset = \"tiny\"\n", "seed.toml");
  ckpt::CheckpointState state;
  state.step = 10;
  state.params["w"] = zeros({2}, DType::Float32);
  state.opt_state["m"] = zeros({2}, DType::Float32);
  state.extra = {{"config", config.to_json()}, {"data", {{"epoch", 0}, {"index", 5}}}, {"tokenizer", "byte"}};
  const fs::path path = ckpt::CheckpointManager(scratch / "run").save(state);
  put(corpus, "manifest", "manifest.json", read_all(path / "manifest.json"));
}

void goodput_log(const fs::path& corpus, const fs::path& scratch) {
  {
    goodput::Recorder recorder(scratch / "run");
    recorder.job_start("seed");
    recorder.attempt_start("first");
    recorder.backend_init_start();
    recorder.backend_init_end("cpu");
    recorder.compile_start("step");
    recorder.compile_end(false);
    for (int64_t step = 1; step <= 3; ++step) {
      recorder.data_wait_start();
      recorder.data_wait_end();
      recorder.step_start(step);
      recorder.step_end(step, 512, 1e9);
    }
    recorder.checkpoint_save_start(3, goodput::SavePart::kBlocking);
    recorder.checkpoint_save_end(3, goodput::SavePart::kBlocking, true);
    recorder.failure(9, 137, "killed");
    recorder.attempt_start("restart");
    recorder.checkpoint_restore_start(3);
    recorder.checkpoint_restore_end(3);
    recorder.eval_start();
    recorder.eval_end();
    recorder.job_end(true);
  }
  put(corpus, "goodput_log", "events.jsonl", read_all(scratch / "run" / "goodput" / "events.jsonl"));
}

compiler::Graph small_graph() {
  return compiler::parse_graph(R"(func @f(%x: f32[2, 3], %y: f32[3]) -> (f32[3, 2], f32[]) {
  %a = add(%x, %y) : f32[2, 3]
  %t = transpose(%a) {perm=[1, 0]} : f32[3, 2]
  %s = reduce_sum(%t) {axes=[0, 1]} : f32[]
  return %t, %s
}
)");
}

void compiler_files(const fs::path& corpus, const fs::path& scratch) {
  const compiler::Graph graph = small_graph();
  put(corpus, "ir_parser", "graph.ir", graph.text());
  put(corpus, "ir_parser", "type.ir", "bf16[4, 8]");
  const std::unique_ptr<compiler::Executable> exe = compiler::compile(graph);
  const std::string bytes = exe->serialize();
  constexpr size_t kPreamble = 4 + 4 + 8 + 8;
  put(corpus, "executable", "body", std::string(1, '\0') + bytes.substr(kPreamble));
  put(corpus, "executable", "whole", std::string(1, '\1') + bytes);

  const fs::path dir = scratch / "cache";
  compiler::CompilationCache cache(dir);
  const compiler::CacheKey key = fuzz::fuzz_cache_key();
  cache.store(key, *exe);
  const compiler::IndexKey index_key = fuzz::fuzz_index_key();
  cache.store_index(index_key, compiler::IndexEntry::of(key, "(f32[3, 2], f32[])"));
  put(corpus, "compilation_cache", "entry_and_index",
      read_all(dir / (key.fingerprint() + ".tsxc")) + std::string(1, '\0') +
          read_all(dir / (index_key.fingerprint() + ".tsxi")));
}

void tensorboard(const fs::path& corpus) {
  std::string bytes(16, '\0');
  const double value = 2.31;
  const int64_t step = 100;
  std::memcpy(bytes.data(), &value, 8);
  std::memcpy(bytes.data() + 8, &step, 8);
  put(corpus, "tensorboard", "two_tags", bytes + "train/loss" + std::string(1, '\0') + "train/lr");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: fuzz_make_seeds CORPUS_DIR (fuzz/corpus)\n");
    return 2;
  }
  const fs::path corpus = argv[1];
  const fs::path scratch = fuzz::scratch_dir();
  token_files(corpus, scratch);
  safetensors(corpus, scratch);
  hf_models(corpus, scratch);
  checkpoint(corpus, scratch);
  goodput_log(corpus, scratch);
  compiler_files(corpus, scratch);
  tensorboard(corpus);
  fs::remove_all(scratch);
  return 0;
}
