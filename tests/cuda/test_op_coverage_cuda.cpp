// CUDA op coverage against the primitive table (ir/primitive_table.h): every row has a
// CUDA kernel or the table's reason for none, and every kernel names a row.
// Registration needs no GPU, so this runs everywhere CUDA is built.
#include <gtest/gtest.h>

#include <set>

#include "backend/cuda/kernel_registry.h"
#include "backend/cuda/runtime.h"
#include "tessera/ir/primitive_table.h"

using namespace tessera;

TEST(OpCoverageCuda, EveryPrimitiveHasAKernelOrAReasonNotTo) {
  cuda::ensure_kernels_registered();
  const std::vector<std::string> k = cuda::kernel_names();
  const std::set<std::string> kernels(k.begin(), k.end());
  int with_kernel = 0;
  for (const PrimitiveEntry& e : primitive_table()) {
    if (!e.ir_name) continue;  // a rule key: the kernel is its IR name's
    const std::string name(e.name);
    const bool has_kernel = kernels.count(name) > 0;
    const bool opted_out = !e.no_cuda_kernel.empty();
    with_kernel += has_kernel;
    EXPECT_TRUE(has_kernel || opted_out) << name << " has no CUDA kernel (src/backend/cuda/eval_"
                                         << family_name(e.family) << ".cpp) and the primitive table gives no reason";
    EXPECT_FALSE(has_kernel && opted_out) << name << " has a kernel and an opt-out";
  }
  EXPECT_GT(with_kernel, 60);
  for (const std::string& name : kernels)
    EXPECT_NE(find_primitive_entry(name), nullptr) << "kernel '" << name << "' names no row of the primitive table";
}
