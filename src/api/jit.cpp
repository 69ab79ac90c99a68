#include "tessera/api/jit.h"

#include <fmt/format.h>

#include <chrono>

#include "api/jit_cache_index.h"
#include "compiler/lazy_graph.h"
#include "core/trace_state.h"
#include "tessera/backend/cuda.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/compile.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/partitioner.h"
#include "tessera/spmd/runtime.h"
#include "tessera/spmd/spmd_executable.h"

namespace tessera {

namespace {

// The GPU that runs mesh device `mesh_device` of a sharded program on `device`: in one
// process, the logical CUDA devices from device.index on (GPUs, or the virtual devices of
// TESSERA_GPU_VIRTUAL_DEVICES); one process per device: device itself.
compiler::DeviceSpec gpu_for_mesh_device(compiler::DeviceSpec device, int mesh_device, const std::string& name) {
  if (spmd::is_multi_process()) return device;
  device.index += mesh_device;
  // (Without a usable GPU, make_device_program says why.)
  const int count = cuda::device_count();
  if (cuda::available() && device.index >= count)
    fail<ValueError>(
        "jit @{}: mesh device {} would run on cuda:{}, but {} CUDA device(s) are present; a mesh runs one device per "
        "GPU from the one named (set TESSERA_GPU_VIRTUAL_DEVICES=N to run an N-device mesh on one GPU)",
        name, mesh_device, device.index, count);
  return device;
}

std::string signature(const std::vector<Array>& leaves, const StaticArgs& statics) {
  std::string key;
  for (const Array& a : leaves) {
    key += type_string(a);
    if (const spmd::Sharding* s = spmd::sharding_of(a)) key += "@" + s->mesh().to_string() + s->to_string();
    key += ";";
  }
  key += "static=";
  for (int64_t s : statics) key += std::to_string(s) + ",";
  return key;
}

std::string join_paths(const std::vector<std::string>& paths) {
  std::string s;
  for (size_t i = 0; i < paths.size() && i < 8; ++i) s += (i ? ", " : "") + (paths[i].empty() ? "<root>" : paths[i]);
  if (paths.size() > 8) s += ", ...";
  return "[" + s + "]";
}

// The layouts of an SPMD call: the options' in_shardings, else each sharded
// argument's own layout, else replicated. nullopt when the call is not SPMD.
std::optional<std::vector<std::optional<spmd::Sharding>>> spmd_input_shardings(const JitOptions& options,
                                                                               const std::vector<Array>& leaves) {
  bool spmd = false;
  std::vector<std::optional<spmd::Sharding>> in(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (i < options.in_shardings.size() && options.in_shardings[i]) {
      in[i] = options.in_shardings[i];
      spmd = true;
    } else if (const spmd::Sharding* s = spmd::sharding_of(leaves[i])) {
      in[i] = *s;
      spmd = true;
    }
  }
  for (const auto& o : options.out_shardings) spmd = spmd || o.has_value();
  if (!spmd) return std::nullopt;
  return in;
}

// The one mesh every layout of a call names (an error naming both when two differ).
spmd::Mesh spmd_mesh(const std::vector<std::optional<spmd::Sharding>>& in,
                     const std::vector<std::optional<spmd::Sharding>>& out) {
  std::optional<spmd::Mesh> mesh;
  auto visit = [&](const std::optional<spmd::Sharding>& s, const char* what, size_t i) {
    if (!s) return;
    if (!mesh) {
      mesh = s->mesh();
    } else if (*mesh != s->mesh()) {
      fail<spmd::ShardingError>("jit: {} {} is on mesh {} but other layouts of the call use mesh {}", what, i,
                                s->mesh().to_string(), mesh->to_string());
    }
  };
  for (size_t i = 0; i < in.size(); ++i) visit(in[i], "argument", i);
  for (size_t i = 0; i < out.size(); ++i) visit(out[i], "output", i);
  return *mesh;
}

// The persistent compilation cache for a call that is not SPMD, or nullptr. GPU
// programs are not cached: their device programs (NVRTC kernels, GEMM algorithm
// choices) are not serializable yet.
std::shared_ptr<compiler::CompilationCache> cache_for(const JitOptions& options) {
  std::shared_ptr<compiler::CompilationCache> cache = compiler::compilation_cache();
  if (cache && compiler::DeviceSpec::parse(options.device).cuda) {
    compiler::note_compilation_cache_skip(options.name,
                                          "GPU programs are not cached yet (device " + options.device + ")");
    return nullptr;
  }
  return cache;
}

// The compile options of a call: GPU programs read attention's operands in place
// (CompileOptions::packed_attention).
compiler::CompileOptions compile_options_for(const JitOptions& options) {
  return compiler::for_device(compiler::DeviceSpec::parse(options.device).cuda, options.compile);
}

// Compiles `traced`, or loads the executable the persistent compilation cache holds
// for it (compiler/compilation_cache.h); with an index key, also records under it
// which entry that was and the output tree, so the next process skips tracing.
std::shared_ptr<compiler::Executable> compile_with_cache(compiler::CompilationCache* cache,
                                                         const compiler::Graph& traced, const JitOptions& options,
                                                         const std::vector<bool>& donated,
                                                         const std::optional<compiler::IndexKey>& index_key,
                                                         const Tree& output_structure) {
  const compiler::CompileOptions compile = compile_options_for(options);
  if (!cache) return compiler::compile(traced, compile, donated);
  const compiler::CacheKey key = compiler::make_cache_key(traced, donated, compile, options.device);
  std::shared_ptr<compiler::Executable> exe = cache->load(key);
  if (!exe) {
    exe = compiler::compile(traced, compile, donated);
    cache->store(key, *exe);
  }
  if (index_key)
    cache->store_index(*index_key, compiler::IndexEntry::of(key, compiler::tree_structure_text(output_structure)));
  return exe;
}

}  // namespace

std::string Lowered::text() const { return spmd_ ? spmd_->program().text() : traced_.text(); }

compiler::Graph trace(const JitFn& fn, const Tree& args, const StaticArgs& statics, Tree* output_structure) {
  std::vector<Array> leaves = args.leaves();
  std::vector<Array> placeholders;
  placeholders.reserve(leaves.size());
  for (const Array& leaf : leaves) placeholders.push_back(Array::placeholder(leaf.shape(), leaf.dtype()));
  Tree out;
  {
    detail::JitTraceScope scope;
    out = fn(args.with_leaves(placeholders), statics);
  }
  std::vector<Array> outs = out.leaves();
  compiler::LazyGraph lg = compiler::build_lazy_graph(
      outs, placeholders, compiler::CapturedArrays::AsConstants, [](const Array& root, const Array& leaf) {
        fail<TransformError>(
            "jit: output {} depends on a placeholder {} that is not an argument of the "
            "jitted function (a value traced by another transform leaked into it)",
            type_string(root), type_string(leaf));
      });
  for (const Array& o : outs) lg.graph.outputs.push_back(lg.value_of(o));
  if (output_structure != nullptr) {
    std::vector<Array> shapes;
    for (const Array& o : outs) shapes.push_back(Array::placeholder(o.shape(), o.dtype()));
    *output_structure = out.with_leaves(shapes);
  }
  return std::move(lg.graph);
}

Jitted::Jitted(JitFn fn, JitOptions options) : state_(std::make_shared<State>()) {
  state_->fn = std::move(fn);
  state_->options = std::move(options);
}

Jitted::Entry& Jitted::entry_for(const Tree& args, const StaticArgs& statics) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<std::string> paths = args.paths();
  if (!s.has_structure) {
    // Placeholders: holding the first call's arrays would keep their buffers alive as
    // long as the Jitted (a step's parameters, for the whole run).
    s.structure = args.map([](const Array& a) { return Array::placeholder(a.shape(), a.dtype()); });
    s.has_structure = true;
  } else if (s.structure.paths() != paths) {
    fail<ValueError>(
        "jit @{}: called with arguments of another tree structure: leaves {} (expected {} as in the first call); "
        "a jitted function takes one argument structure",
        s.options.name, join_paths(paths), join_paths(s.structure.paths()));
  }
  std::vector<Array> leaves = args.leaves();
  std::string key = signature(leaves, statics);
  auto it = s.cache.find(key);
  if (it != s.cache.end()) return it->second;

  auto start = std::chrono::steady_clock::now();
  auto finish = [&](Entry entry) -> Entry& {
    entry.executable->mutable_stats().compile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s.cache.emplace(key, std::move(entry)).first->second;
  };
  std::vector<bool> donated(leaves.size(), false);
  for (int d : s.options.donate_leaves) {
    if (d < 0 || d >= static_cast<int>(leaves.size()))
      fail<ValueError>("jit @{}: donate_leaves names leaf {} but the arguments have {} leaves", s.options.name, d,
                       leaves.size());
    donated[static_cast<size_t>(d)] = true;
  }
  const std::optional<std::vector<std::optional<spmd::Sharding>>> in = spmd_input_shardings(s.options, leaves);
  std::shared_ptr<compiler::CompilationCache> cache = cache_for(s.options);
  std::optional<compiler::IndexKey> index_key;
  // The index keys a call by its argument types, which do not say how they are sharded:
  // SPMD calls use the program-level cache only.
  if (cache && !in && !s.options.cache_identity.empty() && compiler::compilation_index_enabled() &&
      !compiler::build_identity().empty()) {
    index_key = compiler::jit_index_key(s.options, args, key, donated);
    Tree outputs;
    auto check = [&](const compiler::Executable& exe, const compiler::IndexEntry& hit) -> std::string {
      try {
        outputs = compiler::tree_structure_from_text(hit.outputs);
      } catch (const Error& e) {
        return e.what();
      }
      return compiler::index_hit_mismatch(exe, leaves, donated, outputs);
    };
    if (auto hit = cache->load_indexed(*index_key, check)) {
      Entry entry;
      entry.traced.name = s.options.name;
      entry.executable = std::move(hit->executable);
      entry.output_structure = std::move(outputs);
      return finish(std::move(entry));
    }
  }

  Entry entry;
  entry.traced = trace(s.fn, args, statics, &entry.output_structure);
  entry.traced.name = s.options.name;
  ++s.traces;
  if (in) {
    std::vector<std::string> names = args.paths();
    spmd::PartitionOptions partition_options;
    partition_options.parameter_names = names;
    std::vector<std::optional<spmd::Sharding>> out = s.options.out_shardings;
    size_t n_out = entry.traced.outputs.size();
    if (!out.empty()) out.resize(n_out);
    spmd::PartitionedProgram program = spmd::partition(entry.traced, spmd_mesh(*in, out), *in, out, partition_options);
    // Each device's executable of the per-device program: from the persistent cache (the
    // collectives' attributes name the mesh, so the key tells meshes apart), else
    // compiled and stored.
    std::optional<compiler::CacheKey> spmd_key;
    if (cache) spmd_key = compiler::make_cache_key(program.local, donated, s.options.compile, s.options.device);
    auto make_executable = [&](const compiler::Graph& local,
                               const std::vector<bool>& local_donated) -> std::unique_ptr<compiler::Executable> {
      if (spmd_key)
        if (std::unique_ptr<compiler::Executable> exe = cache->load(*spmd_key)) return exe;
      std::unique_ptr<compiler::Executable> exe =
          compiler::compile(local, compile_options_for(s.options), local_donated);
      if (spmd_key) cache->store(*spmd_key, *exe);
      return exe;
    };
    entry.spmd = std::make_shared<spmd::SpmdExecutable>(std::move(program), donated, make_executable);
    // Device 0's executable stands for the program (stats, profile); owned by spmd.
    entry.executable = std::shared_ptr<compiler::Executable>(entry.spmd, &entry.spmd->executable(0));
  } else {
    entry.executable =
        compile_with_cache(cache.get(), entry.traced, s.options, donated, index_key, entry.output_structure);
  }
  if (const compiler::DeviceSpec device = compiler::DeviceSpec::parse(s.options.device); device.cuda) {
    if (entry.spmd) {
      const std::string name = s.options.name;
      entry.spmd->run_on_accelerator([&](std::shared_ptr<compiler::Executable> exe, int mesh_device) {
        return compiler::make_device_program(std::move(exe), gpu_for_mesh_device(device, mesh_device, name));
      });
    } else {
      entry.device_program = compiler::make_device_program(entry.executable, device);
    }
  }
  return finish(std::move(entry));
}

std::string Jitted::profile_text() const {
  std::string text;
  for (const auto& [key, entry] : state_->cache)
    text += entry.device_program ? entry.device_program->profile_text() : entry.executable->profile_text();
  return text;
}

Tree Jitted::operator()(const Tree& args, const StaticArgs& statics) {
  Entry& entry = entry_for(args, statics);
  std::vector<Array> outs = entry.spmd             ? entry.spmd->run(args.leaves())
                            : entry.device_program ? entry.device_program->run(args.leaves())
                                                   : entry.executable->run(args.leaves());
  return entry.output_structure.with_leaves(outs);
}

std::vector<Array> Jitted::operator()(const std::vector<Array>& args, const StaticArgs& statics) {
  std::vector<Tree> items(args.begin(), args.end());
  return (*this)(Tree::list(std::move(items)), statics).leaves();
}

Array Jitted::operator()(const Array& x) { return (*this)(Tree(x)).leaves().at(0); }

Lowered Jitted::lowered(const Tree& args, const StaticArgs& statics) {
  Entry& entry = entry_for(args, statics);
  return Lowered(entry.traced, entry.executable, entry.spmd);
}

Lowered Jitted::lowered(const std::vector<Array>& args, const StaticArgs& statics) {
  std::vector<Tree> items(args.begin(), args.end());
  return lowered(Tree::list(std::move(items)), statics);
}

}  // namespace tessera
