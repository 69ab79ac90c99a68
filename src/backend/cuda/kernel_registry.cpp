#include "backend/cuda/kernel_registry.h"

#include <map>
#include <mutex>

namespace tessera::cuda {

namespace {
struct Registry {
  std::mutex mutex;
  std::map<std::string, KernelFn, std::less<>> kernels;
  std::map<std::string, std::pair<GroupKernelFn, int>, std::less<>> group_kernels;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_kernel(std::string_view op, KernelFn fn) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.kernels[std::string(op)] = std::move(fn);
}

const KernelFn* find_kernel(std::string_view op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.kernels.find(op);
  return it == r.kernels.end() ? nullptr : &it->second;  // std::map nodes are stable
}

void register_group_kernel(std::string_view op, GroupKernelFn fn, int shared_inputs_from) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.group_kernels[std::string(op)] = {std::move(fn), shared_inputs_from};
}

const GroupKernelFn* find_group_kernel(std::string_view op, int* shared_inputs_from) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.group_kernels.find(op);
  if (it == r.group_kernels.end()) return nullptr;
  *shared_inputs_from = it->second.second;
  return &it->second.first;
}

std::vector<std::string> kernel_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, fn] : r.kernels) names.push_back(name);
  return names;
}

const std::map<std::string, std::string>& primitives_without_kernel() {
  static const std::map<std::string, std::string> opt_out = [] {
    std::map<std::string, std::string> m;
    for (const char* collective :
         {"all_gather", "all_reduce", "all_to_all", "reduce_scatter", "shard_pad", "shard_slice"})
      m[collective] =
          "SPMD programs do not run on GPUs yet: collectives go through NCCL communicators outside GPU programs";
    return m;
  }();
  return opt_out;
}

}  // namespace tessera::cuda
