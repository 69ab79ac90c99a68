// bench_hf_io: how fast tessera writes and reads Hugging Face model directories
// (interop/hf_checkpoint.h), next to transformers' from_pretrained / save_pretrained on
// the very directories tessera wrote (bench/peers/hf_io_peer.py, run with the oracle
// venv's python when it exists).
//
//   build/bin/bench_hf_io [--preset gpt2-124m] [--seed 0] [--runs 5] [--max-shard-size 100MB]
//                         [--dir TMP] [--no-peers]
//
// Run from the repository root. A random model of the preset (Model::init(seed)) is
// exported twice, as one model.safetensors and sharded, then imported back; the import
// must equal the parameters bit for bit (else the bench aborts). Times are medians over
// --runs after one untimed run; MB/s = float32 tensor bytes / median time. Export
// includes tessera's fsyncs (its writes are durable; save_pretrained does not fsync).
// The files are hot in the page cache when read (just written, no root to drop the
// cache); the resident fraction is measured with mincore and printed. A table goes to
// stdout; the last line is one JSON object.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/interop/hf_weights.h"
#include "tessera/models/model.h"
#include "train_bench_util.h"

namespace ts = tessera;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kProgram = "bench_hf_io";

struct Flags {
  std::string preset = "gpt2-124m";
  uint64_t seed = 0;
  int64_t runs = 5;
  std::string max_shard_size = "100MB";
  std::string dir;
  bool peers = true;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-peers") {
      f.peers = false;
      continue;
    }
    const std::string value = ts::bench::flag_value(kProgram, argc, argv, i);
    if (arg == "--preset")
      f.preset = value;
    else if (arg == "--seed")
      f.seed = static_cast<uint64_t>(ts::bench::flag_integer(kProgram, arg, value));
    else if (arg == "--runs")
      f.runs = std::max<int64_t>(1, ts::bench::flag_integer(kProgram, arg, value));
    else if (arg == "--max-shard-size")
      f.max_shard_size = value;
    else if (arg == "--dir")
      f.dir = value;
    else
      ts::fail<ts::ValueError>("{}: unknown flag {} (--preset, --seed, --runs, --max-shard-size, --dir, --no-peers)",
                               kProgram, arg);
  }
  return f;
}

double seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median over `runs` after one untimed run; `before` runs untimed before each call.
double median_seconds(int64_t runs, const std::function<void()>& fn, const std::function<void()>& before = {}) {
  if (before) before();
  fn();
  std::vector<double> times;
  for (int64_t r = 0; r < runs; ++r) {
    if (before) before();
    times.push_back(seconds(fn));
  }
  return ts::median(times);
}

uint64_t tensor_bytes(const ts::Tree& params) {
  uint64_t bytes = 0;
  for (const ts::Array& leaf : params.leaves()) bytes += leaf.nbytes();
  return bytes;
}

// Same paths, shapes, dtypes and bytes; a ValueError naming the first difference.
void check_bitwise_equal(const ts::Tree& expected, const ts::Tree& got, const std::string& what) {
  const std::vector<std::string> paths = expected.paths(), got_paths = got.paths();
  if (paths != got_paths)
    ts::fail<ts::ValueError>("{}: {}: the imported tree has {} leaves with other paths (expected {})", kProgram, what,
                             got_paths.size(), paths.size());
  const std::vector<ts::Array> a = expected.leaves(), b = got.leaves();
  for (size_t i = 0; i < a.size(); ++i) {
    a[i].eval();
    b[i].eval();
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype())
      ts::fail<ts::ValueError>("{}: {}: '{}' is {} {} after import (expected {} {})", kProgram, what, paths[i],
                               ts::name(b[i].dtype()), ts::to_string(b[i].shape()), ts::name(a[i].dtype()),
                               ts::to_string(a[i].shape()));
    if (a[i].nbytes() != 0 && std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()) != 0)
      ts::fail<ts::ValueError>("{}: {}: '{}' differs after import (expected a bitwise round trip)", kProgram, what,
                               paths[i]);
  }
}

// Fraction of the directory's safetensors pages resident in the page cache (mincore).
double resident_fraction(const fs::path& dir) {
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t pages = 0, resident = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors" || entry.file_size() == 0) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    const size_t size = entry.file_size();
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) continue;
    std::vector<unsigned char> in_core((size + static_cast<size_t>(page) - 1) / static_cast<size_t>(page));
    if (::mincore(map, size, in_core.data()) == 0) {
      pages += in_core.size();
      for (unsigned char c : in_core) resident += c & 1;
    }
    ::munmap(map, size);
  }
  return pages == 0 ? 0 : static_cast<double>(resident) / static_cast<double>(pages);
}

nlohmann::json run_peer(const Flags& f, const fs::path& single, const fs::path& sharded, const fs::path& scratch) {
  const std::string python = ".venv-oracles/bin/python", script = "bench/peers/hf_io_peer.py";
  if (!f.peers) return nullptr;
  if (!fs::exists(python) || !fs::exists(script)) {
    fmt::print("peer skipped: {} not found (tests/oracles/run_oracle.sh hf_models installs it)\n", python);
    return nullptr;
  }
  if (std::system(fmt::format("{} -c 'import transformers, safetensors, torch' 2>/dev/null", python).c_str()) != 0) {
    fmt::print("peer skipped: {} has no transformers (tests/oracles/run_oracle.sh hf_models installs it)\n", python);
    return nullptr;
  }
  const std::string command =
      fmt::format("{} {} --single '{}' --sharded '{}' --max-shard-size '{}' --out '{}' --runs {}", python, script,
                  single.string(), sharded.string(), f.max_shard_size, scratch.string(), f.runs);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return nullptr;
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  if (::pclose(pipe) != 0) {
    fmt::print("peer failed: {}\n{}\n", command, output);
    return nullptr;
  }
  // The peer's last line is its JSON.
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const size_t line = output.rfind('\n');
  return nlohmann::json::parse(output.substr(line == std::string::npos ? 0 : line + 1));
}

struct Layout {
  std::string name;  // "single", "sharded"
  fs::path dir;
  uint64_t max_shard_bytes = 0;
  size_t files = 0;
  double export_s = 0, convert_s = 0, import_s = 0, read_s = 0, params_s = 0, resident = 0;
};

void measure(Layout& layout, const ts::models::ModelConfig& config, const ts::Tree& params, int64_t runs) {
  ts::interop::HfSaveOptions options;
  options.max_shard_bytes = layout.max_shard_bytes;
  layout.export_s = median_seconds(
      runs, [&] { ts::interop::save_hf_model(layout.dir, config, params, options); },
      [&] { fs::remove_all(layout.dir); });
  // Where export time goes: the layout change (fused qkv split, casts) without the writes.
  layout.convert_s =
      median_seconds(runs, [&] { (void)ts::interop::hf_tensors_from_params(config, params, ts::DType::Float32); });
  for (const auto& entry : fs::directory_iterator(layout.dir))
    if (entry.path().extension() == ".safetensors") ++layout.files;
  layout.resident = resident_fraction(layout.dir);
  ts::interop::HfModel imported;
  layout.import_s = median_seconds(runs, [&] { imported = ts::interop::load_hf_model(layout.dir); });
  check_bitwise_equal(params, imported.params, fmt::format("{} import", layout.name));
  // Where import time goes: the files read into arrays, without the layout change.
  layout.read_s = median_seconds(runs, [&] { (void)ts::interop::read_hf_tensors(layout.dir); });
  // ... and the layout change (qkv regrouping, checks) on tensors already read.
  const ts::interop::HfTensors tensors = ts::interop::read_hf_tensors(layout.dir);
  layout.params_s =
      median_seconds(runs, [&] { (void)ts::interop::params_from_hf(config, tensors, layout.dir.string()); });
}

// Removes the scratch directory however main ends.
struct RemoveOnExit {
  fs::path path;
  ~RemoveOnExit() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

// One table row: tessera's time and MB/s, the peer's, and the speed ratio (peer time /
// tessera time: > 1 means tessera is faster). `peer_s` <= 0: no peer number.
void print_row(const std::string& name, double ours, const std::string& peer_name, double peer_s, double mb) {
  if (peer_s > 0)
    fmt::print("| {} | {:.3f} | {:.0f} | {} | {:.3f} | {:.0f} | {:.2f} |\n", name, ours, mb / ours, peer_name, peer_s,
               mb / peer_s, peer_s / ours);
  else
    fmt::print("| {} | {:.3f} | {:.0f} | {} | - | - | - |\n", name, ours, mb / ours, peer_name);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse_flags(argc, argv);
    const ts::models::ModelConfig config = ts::models::preset(f.preset);
    const ts::models::Model model(config);
    const ts::Tree params = model.init(f.seed);
    for (const ts::Array& leaf : params.leaves()) leaf.eval();
    const uint64_t bytes = tensor_bytes(params);
    const double mb = static_cast<double>(bytes) / 1e6;

    const fs::path root =
        f.dir.empty() ? fs::temp_directory_path() / fmt::format("bench_hf_io-{}", ::getpid()) : fs::path(f.dir);
    if (fs::exists(root) && !fs::is_empty(root))
      ts::fail<ts::IOError>("{}: {} exists and is not empty (choose another --dir)", kProgram, root.string());
    fs::create_directories(root);
    const RemoveOnExit cleanup{root};
    std::vector<Layout> layouts = {
        {"single", root / "single", ts::interop::HfSaveOptions{}.max_shard_bytes},
        {"sharded", root / "sharded", ts::interop::parse_byte_size(f.max_shard_size)},
    };
    for (Layout& layout : layouts) measure(layout, config, params, f.runs);
    const nlohmann::json peer = run_peer(f, layouts[0].dir, layouts[1].dir, root / "peer_out");

    fmt::print("bench_hf_io: {} ({} parameters, {:.1f} MB float32), seed {}, {} runs (median after 1 untimed)\n",
               f.preset, model.parameter_count(), mb, f.seed, f.runs);
    for (const Layout& l : layouts)
      fmt::print("  {}: {} safetensors file(s); {:.0f}% of their pages in the page cache before import (hot)\n", l.name,
                 l.files, 100 * l.resident);
    if (!peer.is_null())
      fmt::print("  peer: torch {}, transformers {}, safetensors {}, {} torch threads\n",
                 peer["versions"]["torch"].get<std::string>(), peer["versions"]["transformers"].get<std::string>(),
                 peer["versions"]["safetensors"].get<std::string>(), peer["threads"].get<int>());
    fmt::print("| operation | tessera s | tessera MB/s | peer | peer s | peer MB/s | speed tessera / peer |\n");
    fmt::print("| --- | --- | --- | --- | --- | --- | --- |\n");
    auto peer_s = [&](const std::string& layout, const char* key) {
      return peer.is_null() ? 0.0 : peer[layout][key].get<double>();
    };
    for (const Layout& l : layouts)
      print_row(fmt::format("export {}", l.name), l.export_s, "save_pretrained", peer_s(l.name, "save_pretrained_s"),
                mb);
    for (const Layout& l : layouts) {
      print_row(fmt::format("import {}", l.name), l.import_s, "from_pretrained (lazy mmap)",
                peer_s(l.name, "from_pretrained_s"), mb);
      print_row(fmt::format("import {}", l.name), l.import_s, "from_pretrained + touch every page",
                peer_s(l.name, "from_pretrained_touched_s"), mb);
    }
    for (const Layout& l : layouts) {
      print_row(fmt::format("read {} (read_hf_tensors)", l.name), l.read_s, "load_file (lazy mmap)",
                peer_s(l.name, "load_file_s"), mb);
      print_row(fmt::format("read {} (read_hf_tensors)", l.name), l.read_s, "load_file + touch every page",
                peer_s(l.name, "load_file_touched_s"), mb);
    }
    for (const Layout& l : layouts)
      print_row(fmt::format("import layout change only ({}, params_from_hf)", l.name), l.params_s, "-", 0, mb);
    for (const Layout& l : layouts)
      print_row(fmt::format("export layout change only ({}, hf_tensors_from_params)", l.name), l.convert_s, "-", 0, mb);

    nlohmann::json out = {{"bench", "hf_io"},      {"preset", f.preset}, {"parameters", model.parameter_count()},
                          {"tensor_bytes", bytes}, {"runs", f.runs},     {"max_shard_size", f.max_shard_size},
                          {"page_cache", "hot"},   {"peer", peer}};
    for (const Layout& l : layouts) {
      nlohmann::json entry = {{"files", l.files},
                              {"resident_fraction", l.resident},
                              {"export_s", l.export_s},
                              {"export_mb_s", mb / l.export_s},
                              {"import_s", l.import_s},
                              {"import_mb_s", mb / l.import_s},
                              {"read_tensors_s", l.read_s},
                              {"import_convert_s", l.params_s},
                              {"export_convert_s", l.convert_s}};
      if (!peer.is_null()) {
        entry["export_speed_vs_save_pretrained"] = peer[l.name]["save_pretrained_s"].get<double>() / l.export_s;
        entry["import_speed_vs_from_pretrained"] = peer[l.name]["from_pretrained_s"].get<double>() / l.import_s;
        entry["import_speed_vs_from_pretrained_touched"] =
            peer[l.name]["from_pretrained_touched_s"].get<double>() / l.import_s;
        entry["read_speed_vs_load_file_touched"] = peer[l.name]["load_file_touched_s"].get<double>() / l.read_s;
      }
      out[l.name] = entry;
    }
    fmt::print("{}\n", out.dump());
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
