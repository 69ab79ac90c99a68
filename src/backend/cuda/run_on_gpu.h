// Test harness: runs one primitive application's CUDA kernel on host data.
//
//   Array y = softmax(x, -1);                       // lazy: nothing runs
//   std::vector<Array> gpu = cuda::run_on_gpu(y);   // y's primitive on the GPU
//   y.eval();                                       // the CPU reference
//
// The primitive's inputs are evaluated on the host and uploaded, every output is
// filled with 0xFF bytes (NaN in every float format) before the kernel runs, so an
// element the kernel never writes fails any comparison, and all of the primitive's
// outputs come back as host arrays (in output order). Kernels get fresh scratch.
#pragma once

#include <vector>

#include "tessera/core/array.h"

namespace tessera::cuda {

std::vector<Array> run_on_gpu(const Array& lazy_output, int device = 0);

}  // namespace tessera::cuda
