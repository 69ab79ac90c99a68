#include "backend/cuda/gpu_executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_allocator.h"
#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/runtime.h"
#include "tessera/backend/device_data.h"
#include "tessera/base/flags.h"
#include "tessera/core/array.h"
#include "tessera/ir/primitives/layout.h"

namespace tessera::cuda {

using compiler::BufferAssignment;
using compiler::Graph;
using compiler::ValueKind;

namespace {

bool env_off(const char* name) {
  const char* v = flags::env(name);
  return v != nullptr && (std::string(v) == "0" || std::string(v) == "off" || std::string(v) == "false");
}

// Scratch grows to the largest request in 256-byte units; kernels ask for it while
// they run, so it must never move during a captured run.
constexpr size_t kScratchAlignment = 256;

}  // namespace

GpuExecutable::GpuExecutable(std::shared_ptr<compiler::Executable> executable, int device)
    : executable_(std::move(executable)), device_(device) {
  require_device(device_);
  ensure_kernels_registered();
  set_device(device_);
  const Graph& g = executable_->graph();
  const compiler::MemoryPlan& plan = executable_->plan();
  const size_t n_values = g.values.size();
  ptr_.assign(n_values, nullptr);
  view_source_.assign(n_values, -1);
  constants_.resize(n_values);

  std::vector<std::string> missing;
  int copies = 0;
  for (const compiler::Node& node : g.nodes) {
    if (node.dead) continue;
    Step step;
    step.primitive = node.primitive.get();
    step.inputs.assign(node.inputs.begin(), node.inputs.end());
    step.outputs.assign(node.outputs.begin(), node.outputs.end());
    // A view op (reshape, identity) whose output the planner placed on its input's
    // buffer launches nothing; one whose output got its own buffer is a copy.
    const int aliased = node.primitive->aliases_input(0);
    if (aliased >= 0 && node.outputs.size() == 1) {
      const int out = node.outputs[0];
      if (plan.values[static_cast<size_t>(out)].kind == BufferAssignment::Kind::View) {
        view_source_[static_cast<size_t>(out)] = node.inputs[static_cast<size_t>(aliased)];
        continue;
      }
      step.kind = Step::Kind::Copy;
      step.inputs = {node.inputs[static_cast<size_t>(aliased)]};
      steps_.push_back(std::move(step));
      continue;
    }
    const bool to_host = dynamic_cast<const OffloadToHost*>(node.primitive.get()) != nullptr;
    if (to_host || dynamic_cast<const LoadFromHost*>(node.primitive.get()) != nullptr) {
      step.kind = to_host ? Step::Kind::ToHost : Step::Kind::ToDevice;
      step.copy = copies++;
      steps_.push_back(std::move(step));
      continue;
    }
    step.kernel = find_kernel(node.primitive->name());
    if (step.kernel == nullptr) {
      if (std::find(missing.begin(), missing.end(), node.primitive->name()) == missing.end())
        missing.push_back(node.primitive->name());
      continue;
    }
    steps_.push_back(std::move(step));
  }
  if (!missing.empty()) {
    std::string names;
    for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
    fail<Error>("cuda: program @{} has ops without a CUDA kernel: {} (ops with kernels: {})", g.name, names,
                fmt::join(kernel_names(), ", "));
  }
  group_steps();
  // Views whose source is itself a view resolve to the root buffer's value.
  for (size_t v = 0; v < n_values; ++v) {
    if (plan.values[v].kind == BufferAssignment::Kind::View && view_source_[v] < 0)
      view_source_[v] = plan.values[v].source;
  }
  for (size_t v = 0; v < n_values; ++v) {
    int root = view_source_[v];
    for (size_t hops = 0; root >= 0 && view_source_[static_cast<size_t>(root)] >= 0; ++hops) {
      if (hops > n_values) fail<Error>("cuda: program @{}: value %{} is a view of itself", g.name, v);
      root = view_source_[static_cast<size_t>(root)];
    }
    view_source_[v] = root;
  }

  DeviceAllocator& alloc = DeviceAllocator::get(device_);
  if (plan.arena_bytes > 0) arena_ = alloc.allocate_shared(plan.arena_bytes);
  if (copies > 0) offload_ = std::make_unique<HostOffloadStreams>(device_, plan.host_arena_bytes, copies);
  plan_offload_waits();
  cudaStream_t s = stream(device_);
  for (size_t v = 0; v < n_values; ++v) {
    const compiler::Value& value = g.values[v];
    if (value.dead) continue;
    if (value.kind == ValueKind::Constant) {
      const size_t bytes = value.type.nbytes();
      constants_[v] = alloc.allocate_shared(bytes);
      if (bytes > 0)
        TESSERA_CUDA_CHECK(
            cudaMemcpyAsync(constants_[v].get(), value.constant.raw_data(), bytes, cudaMemcpyHostToDevice, s));
      ptr_[v] = constants_[v].get();
    } else if (plan.values[v].kind == BufferAssignment::Kind::Arena) {
      ptr_[v] = static_cast<unsigned char*>(arena_.get()) + plan.values[v].offset;
    } else if (plan.values[v].kind == BufferAssignment::Kind::Host) {
      if (!offload_) fail<Error>("cuda: program @{}: host value %{} but no offload step", g.name, v);
      ptr_[v] = offload_->host_base() + plan.values[v].offset;
    }
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));  // the host constants may be freed after this
  graphs_enabled_ = !env_off("TESSERA_CUDA_GRAPHS");
  for (const Step& step : steps_)
    if (step.kind == Step::Kind::Kernel && !kernel_capturable(step.primitive->name())) graphs_enabled_ = false;
  const char* profile = flags::env("TESSERA_PROFILE");
  profiling_ = profile != nullptr && (std::string(profile) == "1" || std::string(profile) == "2");
  profile_steps_ = profiling_ && std::string(profile) == "2";
  kernel_ms_.assign(steps_.size(), 0.0);
}

void GpuExecutable::group_steps() {
  std::vector<Step> merged;
  for (Step& step : steps_) {
    int shared_from = 0;
    const GroupKernelFn* group =
        step.kind == Step::Kind::Kernel ? find_group_kernel(step.primitive->name(), &shared_from) : nullptr;
    if (group != nullptr && !merged.empty()) {
      Step& last = merged.back();
      const Step* head = last.kind == Step::Kind::Group ? &last : nullptr;
      const bool same_op = head != nullptr
                               ? last.primitive->is_equivalent(*step.primitive)
                               : last.kind == Step::Kind::Kernel && last.primitive->name() == step.primitive->name() &&
                                     last.primitive->is_equivalent(*step.primitive);
      const std::vector<int>& first_inputs = head != nullptr ? last.group_inputs[0] : last.inputs;
      bool shared_same = same_op && first_inputs.size() == step.inputs.size();
      for (size_t i = static_cast<size_t>(shared_from); shared_same && i < step.inputs.size(); ++i)
        shared_same = first_inputs[i] == step.inputs[i];
      if (shared_same) {
        if (head == nullptr) {  // turn the previous single step into a group of one
          last.kind = Step::Kind::Group;
          last.group = group;
          last.group_inputs = {last.inputs};
          last.group_outputs = {last.outputs};
        }
        last.group_inputs.push_back(step.inputs);
        last.group_outputs.push_back(step.outputs);
        continue;
      }
    }
    merged.push_back(std::move(step));
  }
  // A group of one is an ordinary step again.
  for (Step& step : merged) {
    if (step.kind == Step::Kind::Group && step.group_inputs.size() == 1) {
      step.kind = Step::Kind::Kernel;
      step.group_inputs.clear();
      step.group_outputs.clear();
    }
  }
  steps_ = std::move(merged);
}

void GpuExecutable::plan_offload_waits() {
  waits_before_.assign(steps_.size(), {});
  if (!offload_) return;
  const Graph& g = executable_->graph();
  const compiler::MemoryPlan& plan = executable_->plan();
  auto root = [&](int v) {
    return view_source_[static_cast<size_t>(v)] >= 0 ? view_source_[static_cast<size_t>(v)] : v;
  };
  // Bytes [begin, end) of the arena under value v (empty when v is not in it).
  auto arena_range = [&](int v) {
    const int r = root(v);
    const BufferAssignment& b = plan.values[static_cast<size_t>(r)];
    if (b.kind != BufferAssignment::Kind::Arena) return std::pair<size_t, size_t>{0, 0};
    return std::pair<size_t, size_t>{b.offset, b.offset + g.type(r).nbytes()};
  };
  auto values_of = [](const Step& s, bool outputs) {
    std::vector<int> ids = outputs ? s.outputs : s.inputs;
    for (const auto& list : outputs ? s.group_outputs : s.group_inputs) ids.insert(ids.end(), list.begin(), list.end());
    return ids;
  };
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    if (step.kind != Step::Kind::ToHost && step.kind != Step::Kind::ToDevice) continue;
    // Offload: wait before the first step that writes into the buffer being copied
    // out. Load: wait before the first step that reads the loaded value (or a view of
    // it). Neither found: join() at the end of the run covers it.
    const auto [begin, end] = arena_range(step.inputs[0]);
    const int loaded = root(step.outputs[0]);
    for (size_t j = i + 1; j < steps_.size(); ++j) {
      bool hit = false;
      if (step.kind == Step::Kind::ToHost) {
        for (int v : values_of(steps_[j], true)) {
          const auto [b, e] = arena_range(v);
          hit = hit || (b < e && begin < end && b < end && begin < e);
        }
      } else {
        for (int v : values_of(steps_[j], false)) hit = hit || root(v) == loaded;
      }
      if (hit) {
        waits_before_[j].push_back(step.copy);
        break;
      }
    }
  }
}

GpuExecutable::~GpuExecutable() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
}

std::string GpuExecutable::device_name() const {
  return fmt::format("cuda:{} ({})", device_, device_info(device_).name);
}

void* GpuExecutable::scratch(size_t bytes) {
  const size_t need = (std::max<size_t>(bytes, 1) + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
  if (need > scratch_bytes_) {
    if (capturing_)
      fail<Error>(
          "cuda: a kernel asked for {} bytes of scratch while a CUDA graph was captured ({} sized on the "
          "first run)",
          need, scratch_bytes_);
    // The old block returns to the cache; work queued on the stream that still uses it
    // runs before anything that could reuse it.
    scratch_ = DeviceAllocator::get(device_).allocate_shared(need);
    scratch_bytes_ = need;
  }
  return scratch_.get();
}

void GpuExecutable::bind(const std::vector<Array>& args, std::vector<std::shared_ptr<void>>& owners) {
  const Graph& g = executable_->graph();
  const compiler::MemoryPlan& plan = executable_->plan();
  if (args.size() != g.parameters.size())
    fail<ValueError>("cuda: program @{} called with {} arguments (expected {})", g.name, args.size(),
                     g.parameters.size());
  DeviceAllocator& alloc = DeviceAllocator::get(device_);
  cudaStream_t s = stream(device_);
  for (size_t i = 0; i < args.size(); ++i) {
    const compiler::TensorType& want = g.type(g.parameters[i]);
    const Array& a = args[i];
    if (a.shape() != want.shape || a.dtype() != want.dtype)
      fail<ValueError>("cuda: program @{}: argument {} is {} (expected {})", g.name, i, type_string(a),
                       to_string(want));
    const auto& data = a.impl()->device_data;
    const size_t v = static_cast<size_t>(g.parameters[i]);
    if (data && data->device == device_) {
      ptr_[v] = data->ptr;
      owners.push_back(data->owner);
      continue;
    }
    // A host array (or one on another device: read through the host) is uploaded.
    const void* host = a.raw_data();
    std::shared_ptr<void> block = alloc.allocate_shared(a.nbytes());
    if (a.nbytes() > 0) TESSERA_CUDA_CHECK(cudaMemcpyAsync(block.get(), host, a.nbytes(), cudaMemcpyHostToDevice, s));
    ptr_[v] = block.get();
    owners.push_back(std::move(block));
  }
  for (size_t o = 0; o < g.outputs.size(); ++o) {
    const size_t v = static_cast<size_t>(g.outputs[o]);
    const BufferAssignment& b = plan.values[v];
    if (b.kind != BufferAssignment::Kind::Output || b.index != static_cast<int>(o)) continue;
    if (b.donor >= 0) {
      ptr_[v] = ptr_[static_cast<size_t>(g.parameters[static_cast<size_t>(b.donor)])];
    } else {
      owners.push_back(alloc.allocate_shared(g.type(static_cast<compiler::ValueId>(v)).nbytes()));
      ptr_[v] = owners.back().get();
    }
  }
  // Views share their root buffer's pointer.
  for (size_t v = 0; v < ptr_.size(); ++v) {
    if (view_source_[v] >= 0) ptr_[v] = ptr_[static_cast<size_t>(view_source_[v])];
  }
}

void GpuExecutable::launch_all(KernelContext& ctx) {
  const Graph& g = executable_->graph();
  std::vector<cudaEvent_t> events;
  // The first run compiles (NVRTC), picks GEMM algorithms and sizes scratch: not profiled.
  const bool profile = profiling_ && !capturing_ && runs_ > 0;
  if (profile) {
    events.resize(steps_.size() + 1);
    for (cudaEvent_t& e : events) TESSERA_CUDA_CHECK(cudaEventCreate(&e));
    TESSERA_CUDA_CHECK(cudaEventRecord(events[0], ctx.stream));
  }
  std::vector<DeviceTensor> ins, outs;
  auto tensors = [&](const std::vector<int>& ids, std::vector<DeviceTensor>& out) {
    out.clear();
    for (int v : ids) {
      const compiler::TensorType& t = g.type(v);
      out.push_back({ptr_[static_cast<size_t>(v)], t.shape, t.dtype});
    }
  };
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    for (int c : waits_before_[i]) offload_->wait(c, ctx.stream);
    try {
      if (step.kind == Step::Kind::ToHost || step.kind == Step::Kind::ToDevice) {
        const int in = step.inputs[0], out = step.outputs[0];
        offload_->copy(step.copy, ptr_[static_cast<size_t>(out)], ptr_[static_cast<size_t>(in)], g.type(out).nbytes(),
                       step.kind == Step::Kind::ToHost ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, ctx.stream);
      } else if (step.kind == Step::Kind::Group) {
        std::vector<std::vector<DeviceTensor>> group_ins(step.group_inputs.size()),
            group_outs(step.group_outputs.size());
        for (size_t t = 0; t < step.group_inputs.size(); ++t) {
          tensors(step.group_inputs[t], group_ins[t]);
          tensors(step.group_outputs[t], group_outs[t]);
        }
        (*step.group)(*step.primitive, group_ins, group_outs, ctx);
      } else {
        tensors(step.inputs, ins);
        tensors(step.outputs, outs);
        if (step.kind == Step::Kind::Copy) {
          if (outs[0].data != ins[0].data && outs[0].nbytes() > 0)
            TESSERA_CUDA_CHECK(
                cudaMemcpyAsync(outs[0].data, ins[0].data, outs[0].nbytes(), cudaMemcpyDeviceToDevice, ctx.stream));
        } else {
          (*step.kernel)(*step.primitive, ins, outs, ctx);
        }
      }
    } catch (const Error& e) {
      const std::string what = e.what();
      const std::string op = step.primitive->name();
      if (what.rfind(op, 0) == 0) throw;
      throw Error(op + ": " + what);
    }
    if (profile) TESSERA_CUDA_CHECK(cudaEventRecord(events[i + 1], ctx.stream));
  }
  if (offload_) offload_->join(ctx.stream);
  if (profile) {
    TESSERA_CUDA_CHECK(cudaEventSynchronize(events.back()));
    for (size_t i = 0; i < steps_.size(); ++i) {
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      kernel_ms_[i] += ms;
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    ++profiled_runs_;
  }
}

std::vector<Array> GpuExecutable::run(const std::vector<Array>& args) {
  std::lock_guard<std::mutex> lock(mutex_);
  set_device(device_);
  const Graph& g = executable_->graph();
  const compiler::MemoryPlan& plan = executable_->plan();
  std::vector<std::shared_ptr<void>> owners;  // owners[i] holds argument i's block, then the outputs'
  owners.reserve(args.size() + g.outputs.size());
  bind(args, owners);

  KernelContext ctx = make_context(device_);
  ctx.scratch = [this](size_t bytes) { return scratch(bytes); };

  // The pointers a captured graph bakes in: arguments and outputs (arena, constants
  // and scratch are fixed for the executable's life).
  std::vector<void*> key;
  for (compiler::ValueId p : g.parameters) key.push_back(ptr_[static_cast<size_t>(p)]);
  for (compiler::ValueId o : g.outputs) key.push_back(ptr_[static_cast<size_t>(o)]);
  bool launched = false;
  if (graphs_enabled_ && !profiling_ && runs_ > 0) {
    auto it = graphs_.find(key);
    if (it == graphs_.end() && static_cast<int>(graphs_.size()) < kMaxGraphs && capture_failures_ == 0) {
      cudaGraph_t graph = nullptr;
      TESSERA_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
      capturing_ = true;
      std::string failure;
      try {
        launch_all(ctx);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      capturing_ = false;
      const cudaError_t end = cudaStreamEndCapture(ctx.stream, &graph);
      cudaGraphExec_t exec = nullptr;
      if (failure.empty() && end == cudaSuccess && graph != nullptr &&
          cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
        it = graphs_.emplace(key, exec).first;
      } else {
        (void)cudaGetLastError();
        ++capture_failures_;
        fmt::print(stderr, "tessera: CUDA graph capture of @{} failed ({}); running kernel by kernel\n", g.name,
                   failure.empty() ? cudaGetErrorString(end) : failure);
      }
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    if (it != graphs_.end()) {
      TESSERA_CUDA_CHECK(cudaGraphLaunch(it->second, ctx.stream));
      ++graph_launches_;
      launched = true;
    }
  }
  if (!launched) launch_all(ctx);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  ++runs_;

  std::vector<Array> results;
  results.reserve(g.outputs.size());
  std::vector<int> parameter_of(g.values.size(), -1);
  for (size_t p = 0; p < g.parameters.size(); ++p)
    parameter_of[static_cast<size_t>(g.parameters[p])] = static_cast<int>(p);
  for (size_t o = 0; o < g.outputs.size(); ++o) {
    const size_t v = static_cast<size_t>(g.outputs[o]);
    const compiler::Value& value = g.values[v];
    if (value.kind == ValueKind::Parameter) {
      results.push_back(args[static_cast<size_t>(parameter_of[v])]);
      continue;
    }
    if (value.kind == ValueKind::Constant) {
      results.push_back(value.constant);
      continue;
    }
    const BufferAssignment& b = plan.values[v];
    auto data = std::make_shared<backend::DeviceData>();
    data->device = device_;
    data->ptr = ptr_[v];
    data->bytes = value.type.nbytes();
    if (b.kind == BufferAssignment::Kind::Output && b.donor >= 0) {
      data->owner = owners[static_cast<size_t>(b.donor)];
    } else {
      // The block bound for this output in bind() (or, for a repeated output, its first occurrence).
      for (const auto& owner : owners)
        if (owner.get() == data->ptr) data->owner = owner;
    }
    if (!data->owner)
      fail<Error>("cuda: program @{}: output {} ({}) has no device buffer of its own (plan kind {})", g.name, o,
                  to_string(value.type), static_cast<int>(b.kind));
    Array r = Array::placeholder(value.type.shape, value.type.dtype);
    r.impl()->device_data = std::move(data);
    results.push_back(std::move(r));
  }
  // Donated arguments whose buffers now hold outputs are no longer valid inputs.
  for (const BufferAssignment& b : plan.values) {
    if (b.kind == BufferAssignment::Kind::Output && b.donor >= 0) {
      const Array& donor = args[static_cast<size_t>(b.donor)];
      donor.impl()->device_data.reset();
      donor.bind_storage(nullptr);
    }
  }
  return results;
}

std::string GpuExecutable::profile_text() const {
  std::map<std::string, std::pair<double, int>> by_op;
  double total = 0;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const std::string name = steps_[i].kind == Step::Kind::Copy    ? "copy"
                             : steps_[i].kind == Step::Kind::Group ? steps_[i].primitive->name() + " (grouped)"
                                                                   : steps_[i].primitive->name();
    by_op[name].first += kernel_ms_[i];
    by_op[name].second += 1;
    total += kernel_ms_[i];
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  const double runs = std::max(profiled_runs_, 1);
  std::string s = fmt::format("{:<20} {:>8} {:>12} {:>7}   (GPU time, {} profiled runs)\n", "op", "kernels", "ms/run",
                              "share", profiled_runs_);
  for (const auto& [name, v] : rows)
    s += fmt::format("{:<20} {:>8} {:>12.3f} {:>6.1f}%\n", name, v.second, v.first / runs,
                     total > 0 ? 100 * v.first / total : 0.0);
  if (!profile_steps_) return s;
  // TESSERA_PROFILE=2: the costliest launches one by one, with their operand types.
  const Graph& g = executable_->graph();
  std::vector<size_t> order(steps_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return kernel_ms_[a] > kernel_ms_[b]; });
  auto types = [&](const std::vector<int>& ids) {
    std::string t;
    for (int v : ids) t += (t.empty() ? "" : ", ") + compiler::to_string(g.type(v));
    return t;
  };
  s += fmt::format("{:>5} {:>9} {:>6}  {}\n", "step", "ms/run", "share", "op (inputs) -> outputs");
  for (size_t k = 0; k < order.size() && k < 60; ++k) {
    const Step& step = steps_[order[k]];
    const bool group = step.kind == Step::Kind::Group;
    s += fmt::format("{:>5} {:>9.3f} {:>5.1f}%  {}{} {} ({}) -> {}\n", order[k], kernel_ms_[order[k]] / runs,
                     total > 0 ? 100 * kernel_ms_[order[k]] / total : 0.0,
                     step.kind == Step::Kind::Copy ? "copy" : step.primitive->name(),
                     group ? fmt::format(" x{}", step.group_inputs.size()) : "", step.primitive->attributes(),
                     types(group ? step.group_inputs[0] : step.inputs),
                     types(group ? step.group_outputs[0] : step.outputs));
  }
  return s;
}

}  // namespace tessera::cuda

namespace tessera::compiler {

std::shared_ptr<DeviceProgram> make_device_program(std::shared_ptr<Executable> executable, const DeviceSpec& device) {
  if (!device.cuda) fail<ValueError>("make_device_program: device {} is not a GPU", device.to_string());
  return std::make_shared<cuda::GpuExecutable>(std::move(executable), device.index);
}

}  // namespace tessera::compiler
