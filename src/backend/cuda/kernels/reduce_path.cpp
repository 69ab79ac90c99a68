// TESSERA_CUDA_REDUCE (kernels/reduce.h): which kernels reduce over leading axes. Host
// code apart from reduce.cu, whose nvcc pass cannot compile fmt's format strings.
#include <atomic>
#include <cstring>

#include "backend/cuda/kernels/reduce.h"
#include "tessera/base/error.h"
#include "tessera/base/flags.h"

namespace tessera::cuda {
namespace {

ReducePath path_from_env() {
  const char* v = flags::env("TESSERA_CUDA_REDUCE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "column") == 0) return ReducePath::Column;
  if (std::strcmp(v, "legacy") == 0) return ReducePath::Legacy;
  fail<ValueError>("TESSERA_CUDA_REDUCE={}: expected column (the default) or legacy", v);
}

std::atomic<ReducePath>& path_storage() {
  static std::atomic<ReducePath> path{path_from_env()};
  return path;
}

}  // namespace

ReducePath reduce_path() { return path_storage().load(); }

void set_reduce_path(ReducePath path) { path_storage().store(path); }

}  // namespace tessera::cuda
