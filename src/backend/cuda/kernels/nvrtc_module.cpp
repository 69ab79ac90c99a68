#include "backend/cuda/kernels/nvrtc_module.h"

#include <nvrtc.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "backend/cuda/kernels/cuda_check.h"
#include "tessera/base/error.h"

namespace tessera::cuda {
namespace {

std::atomic<int64_t> g_compile_count{0};

void check_nvrtc(nvrtcResult status, const char* call) {
  if (status != NVRTC_SUCCESS) fail<Error>("NVRTC error in {}: {}", call, nvrtcGetErrorString(status));
}

// The architecture option for the current device: a cubin ("sm_90") when this NVRTC
// can generate code for it, else PTX for the newest architecture it knows (the driver
// compiles that for the device when the library is loaded).
std::string current_arch() {
  int device = 0, major = 0, minor = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int wanted = major * 10 + minor;
  int count = 0;
  check_nvrtc(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(count));
  if (count > 0) check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  if (std::find(archs.begin(), archs.end(), wanted) != archs.end()) return "sm_" + std::to_string(wanted);
  if (archs.empty() || wanted < archs.front())
    fail<Error>("NVRTC cannot generate code for compute capability {}.{} of device {}", major, minor, device);
  return "compute_" + std::to_string(archs.back());
}

// Numbered lines of a source for error messages: the first `head` lines, and three
// lines around each line NVRTC's log points at ("name.cu(123): error: ...").
std::string source_excerpt(const std::string& source, const std::string& log, int head) {
  std::vector<std::string> lines;
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<bool> show(lines.size(), false);
  for (size_t i = 0; i < lines.size() && i < static_cast<size_t>(head); ++i) show[i] = true;
  int marked = 0;
  for (size_t pos = log.find(".cu("); pos != std::string::npos && marked < 8; pos = log.find(".cu(", pos + 4)) {
    const long line = std::strtol(log.c_str() + pos + 4, nullptr, 10);
    for (long l = line - 3; l <= line + 3; ++l)
      if (l >= 1 && l <= static_cast<long>(lines.size())) show[static_cast<size_t>(l - 1)] = true;
    ++marked;
  }
  std::ostringstream out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!show[i]) continue;
    if (i > 0 && !show[i - 1]) out << "...\n";
    out << i + 1 << ": " << lines[i] << "\n";
  }
  return out.str();
}

// Compiles and loads one source (no caching).
std::shared_ptr<NvrtcModule> build_module(const std::string& source, const std::string& arch,
                                          const std::vector<std::string>& names) {
  nvrtcProgram program = nullptr;
  check_nvrtc(nvrtcCreateProgram(&program, source.c_str(), "tessera_generated.cu", 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&program};
  const std::string arch_option = "--gpu-architecture=" + arch;
  const char* options[] = {arch_option.c_str(), "-default-device", "--std=c++17", "-lineinfo"};
  const nvrtcResult compiled = nvrtcCompileProgram(program, static_cast<int>(std::size(options)), options);
  ++g_compile_count;
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(program, &log_size);
    std::string log(log_size, '\0');
    if (log_size > 0) nvrtcGetProgramLog(program, log.data());
    fail<Error>("NVRTC could not compile a generated kernel for {} ({}):\n{}\nsource:\n{}", arch,
                nvrtcGetErrorString(compiled), log, source_excerpt(source, log, 20));
  }
  std::string code;
  const bool cubin = arch.rfind("sm_", 0) == 0;
  size_t size = 0;
  if (cubin) {
    check_nvrtc(nvrtcGetCUBINSize(program, &size), "nvrtcGetCUBINSize");
    code.resize(size);
    check_nvrtc(nvrtcGetCUBIN(program, code.data()), "nvrtcGetCUBIN");
  } else {
    check_nvrtc(nvrtcGetPTXSize(program, &size), "nvrtcGetPTXSize");
    code.resize(size);
    check_nvrtc(nvrtcGetPTX(program, code.data()), "nvrtcGetPTX");
  }
  cudaLibrary_t library = nullptr;
  TESSERA_CUDA_CHECK(cudaLibraryLoadData(&library, code.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  std::vector<const void*> kernels;
  for (const std::string& name : names) {
    cudaKernel_t kernel = nullptr;
    const cudaError_t status = cudaLibraryGetKernel(&kernel, library, name.c_str());
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) error so later launch checks do not see it
      (void)cudaLibraryUnload(library);
      fail<Error>("generated CUDA source has no kernel '{}' ({})\nsource:\n{}", name, cudaGetErrorString(status),
                  source_excerpt(source, "", 20));
    }
    kernels.push_back(reinterpret_cast<const void*>(kernel));
  }
  return std::make_shared<NvrtcModule>(arch, names, std::move(kernels), library);
}

// The process-wide cache. One entry per (arch, source); an entry's mutex makes a
// second thread asking for a source being compiled wait for that compilation.
struct CacheEntry {
  std::mutex mutex;
  std::shared_ptr<NvrtcModule> module;
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<CacheEntry>> entries;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: libraries outlive static destructors
  return *c;
}

}  // namespace

const void* NvrtcModule::kernel(size_t i) const {
  if (i >= kernels_.size()) fail<ValueError>("nvrtc module: kernel {} of {}", i, kernels_.size());
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit == 0 || (loaded_on_.load(std::memory_order_acquire) & bit) == 0) {
    // Querying attributes loads every kernel of the library into this device's context.
    for (const void* k : kernels_) {
      cudaFuncAttributes attributes{};
      TESSERA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, k));
    }
    loaded_on_.fetch_or(bit, std::memory_order_acq_rel);
  }
  return kernels_[i];
}

std::shared_ptr<const NvrtcModule> compile_module(const std::string& source,
                                                  const std::vector<std::string>& kernel_names) {
  const std::string arch = current_arch();
  std::string key = arch;
  key += '\n';
  for (const std::string& name : kernel_names) (key += name) += ',';
  key += '\n';
  key += source;
  std::shared_ptr<CacheEntry> entry;
  {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    std::shared_ptr<CacheEntry>& slot = c.entries[key];
    if (!slot) slot = std::make_shared<CacheEntry>();
    entry = slot;
  }
  std::lock_guard<std::mutex> lock(entry->mutex);
  if (!entry->module) entry->module = build_module(source, arch, kernel_names);  // a throw leaves it empty
  return entry->module;
}

void launch_kernel(const void* kernel, dim3 grid, dim3 block, void** args, size_t shared_bytes, cudaStream_t stream) {
  TESSERA_CUDA_CHECK(cudaLaunchKernel(kernel, grid, block, args, shared_bytes, stream));
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

int64_t nvrtc_compile_count() { return g_compile_count.load(); }

}  // namespace tessera::cuda
