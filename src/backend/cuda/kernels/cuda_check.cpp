#include "backend/cuda/kernels/cuda_check.h"

#include "tessera/base/error.h"

namespace tessera::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  fail<Error>("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(status), cudaGetErrorString(status), call, file,
              line);
}
void throw_value_error(const std::string& message) { throw ValueError(message); }
void throw_dtype_error(const std::string& message) { throw DTypeError(message); }
void throw_error(const std::string& message) { throw Error(message); }

}  // namespace tessera::cuda
