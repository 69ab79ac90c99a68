#include "tessera/interop/hf_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/interop/hf_config.h"

namespace tessera::interop {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) fail<IOError>("{}: cannot read it", path.string());
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    // Not only parse_error: a number past double's range ("1e999") is an out_of_range.
    fail<IOError>("{}: not valid JSON: {}", path.string(), e.what());
  }
}

void add_file_tensors(HfTensors& out, const fs::path& path) {
  ckpt::SafetensorsFile file = ckpt::read_safetensors(path);
  for (auto& [name, array] : file.tensors) out[name] = HfTensor{std::move(array), path.string()};
}

// The shards of an index, each checked against the weight map both ways.
HfTensors read_indexed(const fs::path& dir) {
  const fs::path index_path = dir / kIndexFile;
  const json index = read_json(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail<IOError>("{}: expected an object with a \"weight_map\" object {{tensor name: shard file}}",
                  index_path.string());
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string())
      fail<IOError>("{}: weight_map[\"{}\"] = {} (expected a file name)", index_path.string(), name, file.dump());
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      fail<IOError>("{}: weight_map[\"{}\"] = \"{}\" is not a file name in the directory", index_path.string(), name,
                    shard);
    if (!fs::is_regular_file(dir / shard))
      fail<IOError>("{}: tensor '{}' is mapped to '{}', which does not exist in {}", index_path.string(), name, shard,
                    dir.string());
    weight_map[name] = shard;
    shards.insert(shard);
  }
  HfTensors out;
  for (const std::string& shard : shards) {
    HfTensors part;
    add_file_tensors(part, dir / shard);
    for (auto& [name, tensor] : part) {
      auto it = weight_map.find(name);
      if (it == weight_map.end())
        fail<IOError>("{}: holds tensor '{}', which {} does not list", tensor.file, name, index_path.string());
      if (it->second != shard)
        fail<IOError>("{}: holds tensor '{}', which {} maps to '{}'", tensor.file, name, index_path.string(),
                      it->second);
      out[name] = std::move(tensor);
    }
  }
  for (const auto& [name, shard] : weight_map)
    if (!out.count(name))
      fail<IOError>("{}: lists tensor '{}' in '{}', but that file does not hold it", index_path.string(), name, shard);
  return out;
}

// Shards in transformers' way: tensors in order, a new shard when the next tensor would
// take the current one over the limit (a tensor larger than the limit gets its own).
std::vector<std::vector<size_t>> plan_shards(const std::vector<std::pair<std::string, Array>>& tensors,
                                             uint64_t max_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t size = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensors[i].second.nbytes();
    if (!shards.back().empty() && size + bytes > max_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(i);
    size += bytes;
  }
  return shards;
}

void write_tensors(const fs::path& dir, const std::vector<std::pair<std::string, Array>>& tensors, uint64_t max_bytes) {
  const std::map<std::string, std::string> metadata{{"format", "pt"}};  // transformers checks it
  const std::vector<std::vector<size_t>> shards = plan_shards(tensors, max_bytes);
  if (shards.size() == 1) {
    std::map<std::string, Array> all(tensors.begin(), tensors.end());
    ckpt::write_safetensors(dir / kSingleFile, all, metadata);
    return;
  }
  json weight_map = json::object();
  uint64_t total_bytes = 0, total_parameters = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::map<std::string, Array> part;
    for (size_t i : shards[s]) {
      part.insert(tensors[i]);
      weight_map[tensors[i].first] = file;
      total_bytes += tensors[i].second.nbytes();
      total_parameters += static_cast<uint64_t>(tensors[i].second.size());
    }
    ckpt::write_safetensors(dir / file, part, metadata);
  }
  const json index = {{"metadata", {{"total_size", total_bytes}, {"total_parameters", total_parameters}}},
                      {"weight_map", weight_map}};
  fileio::write_file_atomic(dir / kIndexFile, index.dump(2) + "\n");
}

void copy_file_durably(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) fail<IOError>("{}: cannot read it (to copy it to {})", from.string(), to.string());
  std::stringstream bytes;
  bytes << in.rdbuf();
  fileio::write_file_atomic(to, bytes.str());
}

}  // namespace

bool is_hf_model_dir(const fs::path& dir) {
  return fs::is_regular_file(dir / kConfigFile) && !fs::exists(dir / "manifest.json");
}

json read_hf_config(const fs::path& dir) {
  if (!fs::exists(dir / kConfigFile)) fail<IOError>("{}: no config.json (expected a Hugging Face model)", dir.string());
  return read_json(dir / kConfigFile);
}

HfTensors read_hf_tensors(const fs::path& dir) {
  if (fs::exists(dir / kIndexFile)) return read_indexed(dir);
  if (fs::exists(dir / kSingleFile)) {
    HfTensors out;
    add_file_tensors(out, dir / kSingleFile);
    return out;
  }
  if (fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json"))
    fail<IOError>(
        "{}: holds PyTorch pickle weights (pytorch_model.bin); only safetensors can be read (convert with "
        "save_pretrained(..., safe_serialization=True))",
        dir.string());
  fail<IOError>("{}: no {} or {} (expected a Hugging Face model directory)", dir.string(), kSingleFile, kIndexFile);
}

HfModel load_hf_model(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail<IOError>("'{}' is not a directory (expected a Hugging Face model)", dir.string());
  HfModel out;
  out.hf_config = read_hf_config(dir);
  out.config = model_config_from_hf(out.hf_config, (dir / kConfigFile).string());
  out.params = params_from_hf(out.config, read_hf_tensors(dir), dir.string());
  return out;
}

void save_hf_model(const fs::path& out_dir, const models::ModelConfig& config, const Tree& params,
                   const HfSaveOptions& options) {
  if (options.max_shard_bytes == 0) fail<ValueError>("hf export: the maximum shard size must be positive");
  if (fs::exists(out_dir) && !(fs::is_directory(out_dir) && fs::is_empty(out_dir)))
    fail<IOError>("{} already exists (choose a new directory or remove it)", out_dir.string());
  // Everything that can fail on the inputs fails before a file is written.
  HfConfigOptions config_options;
  config_options.dtype = options.dtype == DType::BFloat16 ? "bfloat16" : "float32";
  config_options.bos_token_id = options.bos_token_id;
  config_options.eos_token_id = options.eos_token_id;
  json hf_config = hf_config_from_model(config, config_options);
  hf_config["dtype"] = hf_config["torch_dtype"];  // transformers 5 reads "dtype", 4 "torch_dtype"
  const std::vector<std::pair<std::string, Array>> tensors = hf_tensors_from_params(config, params, options.dtype);
  for (const auto& [from, name] : options.extra_files)
    if (!fs::is_regular_file(from)) fail<IOError>("{}: not found (to copy it as {})", from.string(), name);

  const fs::path target = fs::absolute(out_dir).lexically_normal();
  const fs::path parent = target.parent_path();
  fs::create_directories(parent);
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", target.filename().string(), ::getpid());
  fs::remove_all(tmp);
  try {
    fs::create_directory(tmp);
    fileio::write_file_atomic(tmp / kConfigFile, hf_config.dump(2) + "\n");
    write_tensors(tmp, tensors, options.max_shard_bytes);
    for (const auto& [from, name] : options.extra_files) copy_file_durably(from, tmp / name);
    fileio::sync_directory(tmp);
    if (fs::exists(target)) fs::remove(target);  // the empty directory checked above
    std::error_code ec;
    fs::rename(tmp, target, ec);
    if (ec) fail<IOError>("cannot rename {} to {}: {}", tmp.string(), target.string(), ec.message());
    fileio::sync_directory(parent);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
}

uint64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto unit_it = kUnits.find(unit);
  double value = 0;
  bool parsed = !number.empty();
  if (parsed) {
    try {
      size_t used = 0;
      value = std::stod(number, &used);
      parsed = used == number.size();
    } catch (const std::exception&) {
      parsed = false;
    }
  }
  if (!parsed || unit_it == kUnits.end() || !(value > 0))
    fail<ValueError>(
        "size '{}' is not understood (expected a positive number with a unit: 5GB, 500MB, 20KB, 2GiB, "
        "or bytes)",
        text);
  return static_cast<uint64_t>(value * unit_it->second);
}

}  // namespace tessera::interop
