// cuDNN fused attention (cudnn_attention.h): the library opened with dlopen, SDPA graphs
// built once per (direction, dtype, shape, strides) and cached, executed on the caller's
// stream with the caller's workspace.
#include "backend/cuda/kernels/cudnn_attention.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"

#if TESSERA_HAS_CUDNN
// The frontend calls cuDNN (and the CUDA runtime) through symbols it looks up in
// cudnn_dlhandle, which this file opens.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend
#endif

namespace tessera::cuda {

namespace {

#if TESSERA_HAS_CUDNN
CudnnLibrary open_library() {
  CudnnLibrary lib;
  lib.built = true;
  const char* named = flags::env("TESSERA_CUDNN_LIBRARY");
  const std::string name = named != nullptr && *named != '\0' ? named : "libcudnn.so.9";
  // The frontend opens the CUDA runtime by name too: the one tessera links, not another
  // major version that may also be on the library path.
  ::setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", fmt::format("libcudart.so.{}", CUDART_VERSION / 1000).c_str(), 0);
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    lib.reason = fmt::format("cannot open {} ({}; TESSERA_CUDNN_LIBRARY names another file)", name,
                             why != nullptr ? why : "unknown error");
    return lib;
  }
  using GetVersion = size_t (*)();
  auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "cudnnGetVersion"));
  if (get_version == nullptr) {
    lib.reason = fmt::format("{} has no cudnnGetVersion", name);
    dlclose(handle);
    return lib;
  }
  lib.version = static_cast<int>(get_version());
  Dl_info info;
  lib.path =
      dladdr(reinterpret_cast<void*>(get_version), &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : name;
  if (lib.version < 90000) {
    lib.reason = fmt::format("{} is cuDNN {} (fused attention needs cuDNN 9)", lib.path, lib.version);
    dlclose(handle);
    return lib;
  }
  cudnn_frontend::cudnn_dlhandle = handle;
  lib.loaded = true;
  return lib;
}
#else
CudnnLibrary open_library() {
  CudnnLibrary lib;
  lib.reason = "not built (cmake/cudnn.cmake found no cudnn.h or cuDNN frontend at configure time)";
  return lib;
}
#endif

}  // namespace

const CudnnLibrary& cudnn_library() {
  static const CudnnLibrary lib = open_library();
  return lib;
}

std::string cudnn_description() {
  const CudnnLibrary& lib = cudnn_library();
  if (!lib.loaded) return "not used: " + lib.reason;
  return fmt::format("{}.{}.{} ({})", lib.version / 10000, lib.version / 100 % 100, lib.version % 100, lib.path);
}

bool cudnn_attention_selected() {
  const char* v = flags::env("TESSERA_ATTENTION_KERNEL");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return cudnn_library().loaded;
  if (std::strcmp(v, "cudnn") != 0) return false;
  const CudnnLibrary& lib = cudnn_library();
  if (!lib.loaded) fail<Error>("TESSERA_ATTENTION_KERNEL=cudnn, but cuDNN is {}", lib.reason);
  return true;
}

#if TESSERA_HAS_CUDNN

namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// cuDNN's [B, H, S, D] strides of each operand, or why the layout does not fit.
struct CudnnStrides {
  std::vector<int64_t> q, kv, o, stats;
  std::string why_not;
};

CudnnStrides cudnn_strides(const FlashAttentionShape& s, const FlashAttentionLayout& l) {
  CudnnStrides c;
  const int64_t group = s.heads / s.kv_heads;
  // q's head h sits at (h / G) q.group + (h % G) q.head: one stride only when G == 1 or
  // the groups are contiguous runs of heads.
  int64_t q_head = l.q.head;
  if (group == 1)
    q_head = l.q.group;
  else if (l.q.group != group * l.q.head)
    c.why_not = "grouped query heads are not at one stride (the packed qkv layout with G > 1)";
  c.q = {l.q.batch, q_head, l.q.row, 1};
  c.kv = {l.kv.batch, l.kv.head, l.kv.row, 1};
  c.o = {l.o.batch, l.o.head, l.o.row, 1};
  c.stats = {s.heads * s.q_len, s.q_len, 1, 1};
  for (const std::vector<int64_t>* v : {&c.q, &c.kv, &c.o})
    for (int i = 0; i < 3; ++i)
      if ((*v)[static_cast<size_t>(i)] % 8 != 0) c.why_not = "a stride is not a multiple of 8 elements";
  return c;
}

// Why cuDNN does not apply to this problem (before asking cuDNN), or empty.
std::string static_refusal(bool backward, DType dtype, const FlashAttentionShape& s) {
  if (dtype != DType::BFloat16 && dtype != DType::Float16) return "not bfloat16 or float16";
  if (s.mask != nullptr) return "a mask";
  if (s.segments != nullptr) return "segment ids";
  if (s.head_dim % 8 != 0 || s.head_dim > 128) return "head_dim not a multiple of 8 up to 128";
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) return "heads not a multiple of kv heads";
  if (s.batch * s.heads * s.q_len == 0 || s.kv_len == 0) return "an empty problem";
  if (backward && s.q_len == 1 && s.kv_len == 1) return "one query and one key (cuDNN's backward refuses it)";
  return "";
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A built graph (null: cuDNN refused this problem, for `reason`) and its workspace.
struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
  std::string reason;
};

class GraphCache {
 public:
  static GraphCache& get() {
    static GraphCache* cache = new GraphCache;  // never destroyed: outlives every executable
    return *cache;
  }
  std::mutex mutex;  // guards everything below, and each handle while it runs

  cudnnHandle_t handle(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t status = fe::detail::create_handle(&h);
    if (status != CUDNN_STATUS_SUCCESS)
      fail<Error>("cuDNN: cudnnCreate failed on device {} (status {})", device, static_cast<int>(status));
    handles_.emplace(device, h);
    return h;
  }
  std::map<std::vector<int64_t>, CachedGraph> graphs;

 private:
  std::map<int, cudnnHandle_t> handles_;
};

void check(fe::error_t status, const char* step) {
  if (status.is_bad()) throw std::runtime_error(std::string(step) + ": " + status.get_message());
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                     std::vector<int64_t> dim, std::vector<int64_t> stride) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(std::move(dim)).set_stride(std::move(stride)));
}

CachedGraph build(bool backward, DType dtype, const FlashAttentionShape& s, const CudnnStrides& st,
                  cudnnHandle_t handle) {
  CachedGraph out;
  try {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(dtype == DType::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const std::vector<int64_t> q_dim{s.batch, s.heads, s.q_len, s.head_dim},
        kv_dim{s.batch, s.kv_heads, s.kv_len, s.head_dim}, stats_dim{s.batch, s.heads, s.q_len, 1};
    auto q = tensor(*g, "q", kQ, q_dim, st.q);
    auto k = tensor(*g, "k", kK, kv_dim, st.kv);
    auto v = tensor(*g, "v", kV, kv_dim, st.kv);
    const float scale = static_cast<float>(s.scale);
    if (!backward) {
      auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(scale);
      if (s.causal) options.set_causal_mask(true);  // top-left, like tessera's kernels
      auto outputs = g->sdpa(q, k, v, options);
      outputs[0]->set_output(true).set_uid(kO).set_dim(q_dim).set_stride(st.o);
      outputs[1]
          ->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim)
          .set_stride(st.stats);
    } else {
      auto o = tensor(*g, "o", kO, q_dim, st.o);
      auto dout = tensor(*g, "dout", kDO, q_dim, st.o);
      auto stats = tensor(*g, "stats", kStats, stats_dim, st.stats);
      stats->set_data_type(fe::DataType_t::FLOAT);
      auto options = fe::graph::SDPA_backward_attributes()
                         .set_name("attention_grad")
                         .set_attn_scale(scale)
                         .set_deterministic_algorithm(true);  // bitwise-reproducible dQ
      if (s.causal) options.set_causal_mask(true);
      auto grads = g->sdpa_backward(q, k, v, o, dout, stats, options);
      grads[0]->set_output(true).set_uid(kDQ).set_dim(q_dim).set_stride(st.q);
      grads[1]->set_output(true).set_uid(kDK).set_dim(kv_dim).set_stride(st.kv);
      grads[2]->set_output(true).set_uid(kDV).set_dim(kv_dim).set_stride(st.kv);
    }
    check(g->validate(), "validate");
    check(g->build_operation_graph(handle), "build_operation_graph");
    check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    check(g->check_support(handle), "check_support");
    check(g->build_plans(handle), "build_plans");
    check(g->get_workspace_size(out.workspace_bytes), "get_workspace_size");
    out.graph = std::move(g);
  } catch (const std::exception& e) {
    out.graph.reset();
    out.reason = e.what();
  }
  return out;
}

// The cached graph for this problem (built on first use; a refusal is printed once).
const CachedGraph& graph_for(GraphCache& cache, bool backward, DType dtype, const FlashAttentionShape& s,
                             const CudnnStrides& st, int device) {
  std::vector<int64_t> key{backward ? 1 : 0, static_cast<int64_t>(dtype),
                           device,           s.batch,
                           s.heads,          s.kv_heads,
                           s.q_len,          s.kv_len,
                           s.head_dim,       s.causal};
  int64_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.scale, sizeof(scale_bits));
  key.push_back(scale_bits);
  for (const std::vector<int64_t>* v : {&st.q, &st.kv, &st.o}) key.insert(key.end(), v->begin(), v->end());
  auto it = cache.graphs.find(key);
  if (it != cache.graphs.end()) return it->second;
  CachedGraph built = build(backward, dtype, s, st, cache.handle(device));
  if (!built.graph)
    fmt::print(stderr, "tessera: cuDNN attention{} refused {} [{}, {}/{}, {}x{}, {}]{} ({}); tessera's kernel runs\n",
               backward ? " backward" : "", name(dtype), s.batch, s.heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim,
               s.causal ? " causal" : "", built.reason);
  return cache.graphs.emplace(std::move(key), std::move(built)).first->second;
}

bool run(bool backward, DType dtype, const FlashAttentionShape& s, const FlashAttentionLayout& layout,
         std::unordered_map<int64_t, void*> pointers, const CudnnWorkspace& workspace, cudaStream_t stream) {
  if (!cudnn_library().loaded || !static_refusal(backward, dtype, s).empty()) return false;
  for (const auto& [uid, p] : pointers)
    if (!aligned(p)) return false;
  const CudnnStrides st = cudnn_strides(s, layout);
  if (!st.why_not.empty()) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  GraphCache& cache = GraphCache::get();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const CachedGraph& cached = graph_for(cache, backward, dtype, s, st, device);
  if (!cached.graph) return false;
  void* ws = cached.workspace_bytes > 0 ? workspace(static_cast<size_t>(cached.workspace_bytes)) : nullptr;
  cudnnHandle_t handle = cache.handle(device);
  const cudnnStatus_t set = fe::detail::set_stream(handle, stream);
  if (set != CUDNN_STATUS_SUCCESS) fail<Error>("cuDNN: cudnnSetStream failed (status {})", static_cast<int>(set));
  fe::error_t status = cached.graph->execute(handle, pointers, ws);
  if (status.is_bad())
    fail<Error>("cuDNN attention{}: execute failed: {}", backward ? " backward" : "", status.get_message());
  return true;
}

}  // namespace

bool cudnn_attention_forward(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                             const void* q, const void* k, const void* v, void* out, float* lse,
                             const CudnnWorkspace& workspace, cudaStream_t stream) {
  return run(
      false, dtype, shape, layout,
      {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kO, out}, {kStats, lse}},
      workspace, stream);
}

bool cudnn_attention_backward(DType dtype, const FlashAttentionShape& shape, const FlashAttentionLayout& layout,
                              const void* q, const void* k, const void* v, const void* out, const float* lse,
                              const void* dout, void* dq, void* dk, void* dv, const CudnnWorkspace& workspace,
                              cudaStream_t stream) {
  return run(true, dtype, shape, layout,
             {{kQ, const_cast<void*>(q)},
              {kK, const_cast<void*>(k)},
              {kV, const_cast<void*>(v)},
              {kO, const_cast<void*>(out)},
              {kStats, const_cast<float*>(lse)},
              {kDO, const_cast<void*>(dout)},
              {kDQ, dq},
              {kDK, dk},
              {kDV, dv}},
             workspace, stream);
}

#else  // no cuDNN in this build: tessera's kernels always run

bool cudnn_attention_forward(DType, const FlashAttentionShape&, const FlashAttentionLayout&, const void*, const void*,
                             const void*, void*, float*, const CudnnWorkspace&, cudaStream_t) {
  return false;
}
bool cudnn_attention_backward(DType, const FlashAttentionShape&, const FlashAttentionLayout&, const void*, const void*,
                              const void*, const void*, const float*, const void*, void*, void*, void*,
                              const CudnnWorkspace&, cudaStream_t) {
  return false;
}

#endif

}  // namespace tessera::cuda
