// `tessera ckpt ls|verify|inspect|import-hf|export-hf`: what checkpoints a run has,
// whether they are intact (checksums against manifest.json), what one holds (manifest
// and tensors), and Hugging Face model directories in and out (train/pretrained.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tessera/base/error.h"
#include "tessera/base/json_field.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/train/pretrained.h"

namespace fs = std::filesystem;

namespace tessera::cli {
namespace {

struct CkptArgs {
  std::string ls_path, verify_path, inspect_path;
  bool no_verify = false;
  bool full_manifest = false;
  std::string import_source, import_out, export_source, export_out;
  std::string export_dtype = "float32";
  std::string max_shard_size = "5GB";
};

bool is_checkpoint_dir(const fs::path& path) { return fs::exists(path / "manifest.json"); }

// The checkpoints directory of a run directory (RUN/checkpoints), or the path itself
// when it already is one.
fs::path checkpoints_dir(const fs::path& path) {
  if (!fs::is_directory(path)) fail<IOError>("{} is not a directory", path.string());
  return fs::is_directory(path / "checkpoints") ? path / "checkpoints" : path;
}

std::vector<ckpt::CheckpointInfo> checkpoints_of(const fs::path& path) {
  const fs::path dir = checkpoints_dir(path);
  std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(dir);
  if (all.empty()) fail<IOError>("no checkpoints (step_<N> directories) in {}", dir.string());
  return all;
}

int run_ls(const CkptArgs& args) {
  const std::vector<ckpt::CheckpointInfo> all = checkpoints_of(args.ls_path);
  fmt::print("{:>10}  {:>9}  {:<20}  {}\n", "step", "size", "created", args.no_verify ? "" : "verified");
  for (const ckpt::CheckpointInfo& info : all) {
    std::string verified;
    if (!args.no_verify) {
      const ckpt::VerifyResult result = ckpt::CheckpointManager::verify(info.path);
      verified = result.ok ? "ok" : "FAILED: " + result.problem;
    }
    fmt::print("{:>10}  {:>9}  {:<20}  {}\n", info.step, human_bytes(info.bytes),
               info.created.empty() ? "?" : info.created, verified);
  }
  return 0;
}

int run_verify(const CkptArgs& args) {
  const fs::path path = args.verify_path;
  std::vector<fs::path> targets;
  if (is_checkpoint_dir(path)) {
    targets.push_back(path);
  } else {
    for (const ckpt::CheckpointInfo& info : checkpoints_of(path)) targets.push_back(info.path);
  }
  int failed = 0;
  for (const fs::path& target : targets) {
    const ckpt::VerifyResult result = ckpt::CheckpointManager::verify(target);
    if (result.ok) {
      fmt::print("ok      {}\n", target.string());
    } else {
      ++failed;
      fmt::print("FAILED  {}: {}\n", target.string(), result.problem);
    }
  }
  if (targets.size() > 1) fmt::print("{} of {} checkpoints verified\n", targets.size() - failed, targets.size());
  return failed == 0 ? 0 : 1;
}

void print_tensors(const fs::path& file) {
  const ckpt::SafetensorsHeader header = ckpt::read_safetensors_header(file);
  size_t width = 4;
  for (const auto& entry : header.tensors) width = std::max(width, entry.name.size());
  fmt::print("\n{} ({} tensors)\n", file.filename().string(), header.tensors.size());
  fmt::print("  {:<{}}  {:<5}  {:<18}  {:>10}\n", "name", width, "dtype", "shape", "bytes");
  uint64_t total = 0, elements = 0;
  for (const auto& entry : header.tensors) {
    const uint64_t bytes = entry.end - entry.begin;
    total += bytes;
    elements += bytes / itemsize(entry.dtype);
    fmt::print("  {:<{}}  {:<5}  {:<18}  {:>10}\n", entry.name, width, ckpt::safetensors_dtype(entry.dtype),
               to_string(entry.shape), bytes);
  }
  fmt::print("  total: {} elements, {}\n", elements, human_bytes(total));
}

int run_inspect(const CkptArgs& args) {
  fs::path path = args.inspect_path;
  if (!is_checkpoint_dir(path)) path = checkpoints_of(path).back().path;  // a run: its newest checkpoint
  const nlohmann::json manifest = ckpt::read_manifest(path);
  if (args.full_manifest) {
    fmt::print("{}\n", manifest.dump(2));
    return 0;
  }
  fmt::print("checkpoint {}\n", path.string());
  fmt::print("  format   {} v{}\n", json_field_or<std::string>(manifest, "format", "?"),
             manifest.contains("version") ? manifest["version"].dump() : "?");
  fmt::print("  step     {}\n", manifest.contains("step") ? manifest["step"].dump() : "?");
  fmt::print("  created  {}\n", json_field_or<std::string>(manifest, "created", "?"));
  if (manifest.contains("files") && manifest["files"].is_object())
    for (const auto& [name, entry] : manifest["files"].items()) {
      const std::optional<uint64_t> bytes = json_field<uint64_t>(entry, "bytes");
      fmt::print("  file     {}  {} bytes  xxh3 {}\n", name, bytes ? fmt::format("{}", *bytes) : "?",
                 json_field_or<std::string>(entry, "xxh3", "?"));
    }
  if (manifest.contains("extra") && manifest["extra"].is_object()) {
    for (const auto& [key, value] : manifest["extra"].items()) {
      std::string text = value.dump();
      if (text.size() > 90) text = text.substr(0, 87) + "...";
      fmt::print("  extra    {}: {}\n", key, text);
    }
  }
  for (const char* file : {"params.safetensors", "opt_state.safetensors"})
    if (fs::exists(path / file)) print_tensors(path / file);
  fmt::print("\n(--manifest prints the whole manifest.json; `tessera ckpt verify` checks the checksums)\n");
  return 0;
}

int run_import_hf(const CkptArgs& args) {
  const train::ImportResult result = train::import_hf(args.import_source, args.import_out, print_warning);
  const models::ModelConfig& c = result.config;
  fmt::print(
      "imported {} ({} model: vocab {}, dim {}, layers {}, heads {}, kv_heads {}, context {}, {:.2f}M parameters)\n",
      args.import_source, c.family, c.vocab, c.dim, c.layers, c.heads, c.resolved_kv_heads(), c.context,
      static_cast<double>(models::Model(c).parameter_count()) / 1e6);
  fmt::print("  checkpoint {}\n", result.checkpoint.string());
  if (result.tokenizer)
    fmt::print("  tokenizer  {} ({})\n", result.tokenizer->id, result.tokenizer->spec);
  else
    fmt::print("  tokenizer  none in {} (pass one to `tessera sample --tokenizer`)\n", args.import_source);
  fmt::print("  use: tessera sample --ckpt {} | tessera train --init-from {} ...\n", args.import_out, args.import_out);
  return 0;
}

int run_export_hf(const CkptArgs& args) {
  train::ExportOptions options;
  if (args.export_dtype == "float32")
    options.dtype = DType::Float32;
  else if (args.export_dtype == "bfloat16")
    options.dtype = DType::BFloat16;
  else
    fail<ValueError>("--dtype {} is not supported (float32 or bfloat16)", args.export_dtype);
  options.max_shard_bytes = interop::parse_byte_size(args.max_shard_size);
  train::export_hf(args.export_source, args.export_out, options, print_warning);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(args.export_out)) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  fmt::print("exported {} to {} ({}): {}\n", args.export_source, args.export_out, args.export_dtype,
             fmt::join(files, ", "));
  return 0;
}

}  // namespace

Command add_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "List, verify and inspect checkpoints");
  ckpt->require_subcommand(1);
  auto args = std::make_shared<CkptArgs>();
  CLI::App* ls = ckpt->add_subcommand("ls", "List a run's checkpoints: step, size, created, verified");
  ls->add_option("run_dir", args->ls_path, "Run directory (or its checkpoints/ directory)")->required();
  ls->add_flag("--no-verify", args->no_verify, "Do not read the files to verify checksums");
  CLI::App* verify =
      ckpt->add_subcommand("verify", "Check checksums of one checkpoint or every one of a run; exit 1 if any fails");
  verify->add_option("path", args->verify_path, "A checkpoint directory or a run directory")->required();
  CLI::App* inspect =
      ckpt->add_subcommand("inspect", "Show a checkpoint's manifest and its tensors (name, dtype, shape, bytes)");
  inspect->add_option("path", args->inspect_path, "A checkpoint directory, or a run directory (its newest checkpoint)")
      ->required();
  inspect->add_flag("--manifest", args->full_manifest, "Print the whole manifest.json instead");
  CLI::App* import_hf = ckpt->add_subcommand(
      "import-hf", "Hugging Face model directory (GPT-2 or Llama, safetensors) -> a tessera run directory");
  import_hf->add_option("hf_dir", args->import_source, "Directory with config.json and model*.safetensors")->required();
  import_hf->add_option("out_dir", args->import_out, "New run directory (gets checkpoints/step_00000000)")->required();
  CLI::App* export_hf = ckpt->add_subcommand(
      "export-hf", "A checkpoint or run -> a Hugging Face model directory (config.json, safetensors, tokenizer)");
  export_hf->add_option("source", args->export_source, "Checkpoint, run directory (newest valid checkpoint)")
      ->required();
  export_hf->add_option("out_dir", args->export_out, "New directory to write")->required();
  export_hf->add_option("--dtype", args->export_dtype, "Tensor dtype: float32 (default) or bfloat16");
  export_hf->add_option("--max-shard-size", args->max_shard_size,
                        "Start a new model-0000k-of-0000n.safetensors shard past this size (default 5GB)");
  return Command{ckpt, [args, ls, verify, import_hf, export_hf] {
                   if (ls->parsed()) return run_ls(*args);
                   if (verify->parsed()) return run_verify(*args);
                   if (import_hf->parsed()) return run_import_hf(*args);
                   if (export_hf->parsed()) return run_export_hf(*args);
                   return run_inspect(*args);
                 }};
}

}  // namespace tessera::cli
