// CUDA op coverage: every primitive the IR parser knows has a CUDA kernel or an
// explicit opt-out with its reason (backend/cuda/kernel_registry.cpp), and every
// kernel names a primitive. Registration needs no GPU, so this runs everywhere CUDA
// is built.
#include <gtest/gtest.h>

#include <set>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/runtime.h"
#include "tessera/compiler/primitive_registry.h"

using namespace tessera;

TEST(OpCoverageCuda, EveryPrimitiveHasAKernelOrAReasonNotTo) {
  cuda::ensure_kernels_registered();
  const std::vector<std::string> v = compiler::primitive_names();
  const std::set<std::string> names(v.begin(), v.end());
  const std::vector<std::string> k = cuda::kernel_names();
  const std::set<std::string> kernels(k.begin(), k.end());
  const auto& opt_out = cuda::primitives_without_kernel();
  for (const std::string& name : names) {
    EXPECT_TRUE(kernels.count(name) || opt_out.count(name))
        << name << " has no CUDA kernel (src/backend/cuda/eval_<family>.cpp) and no opt-out "
        << "(primitives_without_kernel in src/backend/cuda/kernel_registry.cpp)";
    EXPECT_FALSE(kernels.count(name) && opt_out.count(name)) << name << " has a kernel and an opt-out";
  }
  for (const std::string& name : kernels)
    EXPECT_TRUE(names.count(name)) << "kernel '" << name << "' names no primitive";
  for (const auto& [name, reason] : opt_out) {
    EXPECT_TRUE(names.count(name)) << "the opt-out names '" << name << "', which is not a primitive";
    EXPECT_FALSE(reason.empty()) << name;
  }
}
