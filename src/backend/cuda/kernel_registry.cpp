#include "backend/cuda/kernel_registry.h"

#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "tessera/ir/primitive_table.h"

namespace tessera::cuda {

namespace {
struct Registry {
  std::mutex mutex;
  std::map<std::string, KernelFn, std::less<>> kernels;
  std::map<std::string, std::pair<GroupKernelFn, int>, std::less<>> group_kernels;
  std::set<std::string, std::less<>> not_capturable;
};
Registry& registry() {
  static Registry r;
  return r;
}
// The family being registered (only inside register_builtin_kernels).
std::optional<OpFamily> g_registering;

void check_builtin(std::string_view op) {
  if (g_registering) check_registration(op, *g_registering, OpProvider::CudaKernel);
}
}  // namespace

void register_builtin_kernels() {
  const std::pair<OpFamily, void (*)()> families[] = {
      {OpFamily::Elementwise, register_elementwise_kernels}, {OpFamily::Layout, register_layout_kernels},
      {OpFamily::Linalg, register_linalg_kernels},           {OpFamily::Reduce, register_reduce_kernels},
      {OpFamily::Indexing, register_indexing_kernels},       {OpFamily::Nn, register_nn_kernels},
      {OpFamily::Attention, register_attention_kernels},     {OpFamily::Optim, register_optim_kernels},
      {OpFamily::Random, register_random_kernels},           {OpFamily::Collective, register_collective_kernels}};
  for (const auto& [family, register_family] : families) {
    g_registering = family;
    register_family();
  }
  g_registering.reset();
}

void register_kernel(std::string_view op, KernelFn fn, bool capturable) {
  check_builtin(op);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.kernels[std::string(op)] = std::move(fn);
  if (capturable)
    r.not_capturable.erase(std::string(op));
  else
    r.not_capturable.insert(std::string(op));
}

bool kernel_capturable(std::string_view op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.not_capturable.find(op) == r.not_capturable.end();
}

const KernelFn* find_kernel(std::string_view op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.kernels.find(op);
  if (it == r.kernels.end()) return custom_op_kernel(op);
  return &it->second;  // std::map nodes are stable
}

void register_group_kernel(std::string_view op, GroupKernelFn fn, int shared_inputs_from) {
  check_builtin(op);
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

}  // namespace tessera::cuda
