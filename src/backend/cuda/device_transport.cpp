#include "backend/cuda/device_transport.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "backend/cuda/kernels/cuda_check.h"
#include "backend/cuda/runtime.h"
#include "tessera/base/error.h"
#if TESSERA_HAS_NCCL
#include "spmd/nccl/communicator_nccl.h"
#endif

namespace tessera::cuda {

namespace {

class InProcessTransport final : public DeviceTransport {
 public:
  std::string kind() const override { return "in-process device copies"; }

  void all_gather(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group, const void* send,
                  void* recv, size_t bytes, cudaStream_t stream) override {
    exchange(context, cuda_device, group, send, recv, bytes, stream, false);
  }
  void all_to_all(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group, const void* send,
                  void* recv, size_t bytes, cudaStream_t stream) override {
    exchange(context, cuda_device, group, send, recv, bytes, stream, true);
  }

 private:
  // What member k of a group posts, and its events (one pair per member and group:
  // each is recorded again only after the group's next barrier, when every peer has
  // queued its wait on the previous record).
  struct Post {
    const void* send = nullptr;
    cudaEvent_t ready = nullptr;  // the member's stream reached the collective
    cudaEvent_t done = nullptr;   // the member finished reading its peers' buffers
  };

  std::vector<Post>& posts_of(const std::vector<int>& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Post>& posts = posts_[group];
    if (posts.empty()) posts.resize(group.size());
    return posts;  // std::map nodes are stable
  }

  void exchange(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group, const void* send,
                void* recv, size_t bytes, cudaStream_t stream, bool to_all) {
    const auto found = std::find(group.begin(), group.end(), context.device);
    if (found == group.end()) fail<ValueError>("device collective: device {} is not in its group", context.device);
    const size_t index = static_cast<size_t>(found - group.begin());
    std::vector<Post>& posts = posts_of(group);
    Post& mine = posts[index];
    if (mine.ready == nullptr) {
      set_device(cuda_device);
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&mine.ready, cudaEventDisableTiming));
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&mine.done, cudaEventDisableTiming));
    }
    mine.send = send;
    TESSERA_CUDA_CHECK(cudaEventRecord(mine.ready, stream));
    spmd::Communicator& host = *context.communicator;
    host.barrier(context.device, group);  // every post is visible after this
    char* out = static_cast<char*>(recv);
    for (size_t k = 0; k < posts.size(); ++k) {
      if (k != index) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(stream, posts[k].ready, 0));
      const char* from = static_cast<const char*>(posts[k].send) + (to_all ? index * bytes : 0);
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(out + k * bytes, from, bytes, cudaMemcpyDefault, stream));
    }
    TESSERA_CUDA_CHECK(cudaEventRecord(mine.done, stream));
    host.barrier(context.device, group);
    for (size_t k = 0; k < posts.size(); ++k)
      if (k != index) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(stream, posts[k].done, 0));
  }

  std::mutex mutex_;
  std::map<std::vector<int>, std::vector<Post>> posts_;
};

#if TESSERA_HAS_NCCL
class NcclTransport final : public DeviceTransport {
 public:
  std::string kind() const override { return "nccl"; }

  void all_gather(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group, const void* send,
                  void* recv, size_t bytes, cudaStream_t stream) override {
    world(cuda_device).all_gather_device(group, send, recv, bytes, stream);
  }
  void all_to_all(const spmd::DeviceContext& context, int cuda_device, const std::vector<int>& group, const void* send,
                  void* recv, size_t bytes, cudaStream_t stream) override {
    world(cuda_device).all_to_all_device(group, send, recv, bytes, stream);
  }

 private:
  spmd::NcclCommunicator& world(int cuda_device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!world_) {
      spmd::NcclOptions options;
      options.device = physical_device(cuda_device);
      world_ = std::make_unique<spmd::NcclCommunicator>(options);
    }
    if (world_->cuda_device() != physical_device(cuda_device))
      fail<ValueError>("device collective: this process's NCCL world is on GPU {}, but a program runs on GPU {}",
                       world_->cuda_device(), physical_device(cuda_device));
    return *world_;
  }

  std::mutex mutex_;
  std::unique_ptr<spmd::NcclCommunicator> world_;
};
#endif

}  // namespace

DeviceTransport& transport_for(const spmd::DeviceContext& context) {
  if (context.communicator == nullptr) fail<Error>("device collective: device {} has no communicator", context.device);
  const std::string kind = context.communicator->kind();
  if (kind == "local") {
    static InProcessTransport in_process;
    return in_process;
  }
#if TESSERA_HAS_NCCL
  static NcclTransport nccl;
  return nccl;
#else
  fail<Error>(
      "device collective: the runtime is a multi-process '{}' world, whose GPU programs exchange their blocks "
      "through NCCL, but this build has no NCCL (install libnccl-dev and rebuild, or run the mesh in one process "
      "with TESSERA_GPU_VIRTUAL_DEVICES)",
      kind);
#endif
}

}  // namespace tessera::cuda
