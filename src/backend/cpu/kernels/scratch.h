// Per-thread, grow-only scratch buffers for kernels: a compiled program's runs must not
// allocate, so kernels take their temporary buffers from here instead of std::vector.
// A buffer grows (once, on the first call that needs the size) and is then reused by
// every later call on the same thread; it is freed when the thread exits.
//
// Buffers used inside parallel_for bodies come from a ChunkScratch taken by the calling
// thread: which pool thread runs which chunk changes from run to run, so a thread-local
// buffer in a body could first grow in any later run.
//
// Slots: a buffer stays valid until the next thread_scratch call with the same slot on
// the same thread, so buffers alive at the same time need distinct slots. The thread
// calling parallel_for runs chunks too, so a buffer taken around a parallel_for and one
// taken inside its body must use different slots. Each kernel file uses its own slots
// (listed below), so kernels calling each other never share one.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "tessera/base/thread_pool.h"

namespace tessera::cpu {

enum class Scratch : int {
  ReducePartials,      // reduce.cpp: block partials around a parallel_for
  ReduceGroupPartial,  // reduce.cpp: a trailing-group partial result
  ReducePermuted,      // reduce.cpp: the permuted copy
  ReduceChunks,        // reduce.cpp: ChunkScratch of the row / column / arg reductions
  FusedPartials,       // fused_elementwise.cpp: fused reduction block partials
  FusedChunks,         // fused_elementwise.cpp: ChunkScratch of the tile buffers
  NormWeight,          // norm.cpp: the weight widened to the accumulator type
  NormBias,            // norm.cpp: the bias widened to the accumulator type
  NormOnes,            // norm.cpp: a unit weight
  NormWeightGrad,      // norm.cpp: per-chunk weight-gradient partials
  NormBiasGrad,        // norm.cpp: per-chunk bias-gradient partials
  AttentionDelta,      // attention_backward.cpp: rowwise delta
  AttentionDq,         // attention_backward.cpp: per-task dQ partials
  AttentionChunks,     // attention_{forward,backward}.cpp: ChunkScratch of the tiles
  AttentionPacked,     // eval_attention.cpp: the packed primitives' unpacked operands and results
  GatherIndices,       // gather.cpp: normalized indices
  MatmulA,             // matmul.cpp: widened 16-bit panels of a
  MatmulB,             // matmul.cpp: widened 16-bit panels of b
  MatmulC,             // matmul.cpp: float32 result of the widened product
  MatmulChunks,        // matmul.cpp: ChunkScratch of the integer row accumulators
  MatmulTile,          // matmul.cpp: ChunkScratch of the AMX packing/accumulators and the bf16 epilogue rows
  MatmulInt8,          // matmul_int8.cpp: the quantized operands and their scales
  MatmulInt8Chunks,    // matmul_int8.cpp: ChunkScratch of the int32 accumulators and float32 rows
  SoftmaxChunks,       // softmax.cpp: ChunkScratch of the widened 16-bit rows
  CrossEntropyChunks,  // cross_entropy.cpp: ChunkScratch of the widened 16-bit rows
  NormChunks,          // norm.cpp: ChunkScratch of the widened 16-bit rows
  OptimChunks,         // optim.cpp: ChunkScratch of the widened 16-bit spans
  Misc0,               // free for a kernel that calls no other kernel while holding it
  Misc1,
  Count
};

namespace detail {

struct ScratchBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(data); }
};

inline void* thread_scratch_bytes(size_t bytes, Scratch slot) {
  constexpr size_t kAlign = 64;
  thread_local ScratchBuffer buffers[static_cast<int>(Scratch::Count)];
  ScratchBuffer& b = buffers[static_cast<int>(slot)];
  if (b.bytes < bytes || b.data == nullptr) {
    const size_t want = (bytes + kAlign - 1) / kAlign * kAlign + kAlign;  // never 0
    void* p = std::aligned_alloc(kAlign, want);
    if (!p) throw std::bad_alloc();
    std::free(b.data);
    b.data = p;
    b.bytes = want;
  }
  return b.data;
}

}  // namespace detail

// A 64-byte aligned buffer of at least n (uninitialized) elements of T, private to the
// calling thread and `slot`. Valid until this thread's next call with the same slot.
template <typename T>
T* thread_scratch(size_t n, Scratch slot) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static_assert(alignof(T) <= 64);
  return static_cast<T*>(detail::thread_scratch_bytes(n * sizeof(T), slot));
}

// Scratch for the bodies of one parallel_for, taken on the calling thread before it:
// num_threads() buffers of `bytes`, one leased by each running chunk. Its size depends
// only on the call, so runs after the first allocate nothing whichever threads run
// which chunks. Usage:
//   const ChunkScratch scratch(bytes, Scratch::X);
//   parallel_for(n, grain, [&](int64_t b, int64_t e) {
//     ChunkScratch::Lease lease(scratch);
//     float* buf = lease.as<float>();
//     ...
class ChunkScratch {
 public:
  ChunkScratch(size_t bytes, Scratch slot)
      : stride_(round_up(std::max<size_t>(bytes, 1))), count_(static_cast<size_t>(std::max(1, num_threads()))) {
    const size_t flag_bytes = round_up(count_ * sizeof(uint32_t));
    auto* base = static_cast<unsigned char*>(detail::thread_scratch_bytes(flag_bytes + count_ * stride_, slot));
    flags_ = reinterpret_cast<uint32_t*>(base);
    std::fill(flags_, flags_ + count_, 0u);
    data_ = base + flag_bytes;
  }
  ChunkScratch(const ChunkScratch&) = delete;
  ChunkScratch& operator=(const ChunkScratch&) = delete;

  // A buffer of the scratch, held by one chunk until the lease ends. At most
  // num_threads() chunks run at once, so a free one always exists.
  class Lease {
   public:
    explicit Lease(const ChunkScratch& scratch) : scratch_(scratch) {
      for (;;)
        for (size_t i = 0; i < scratch.count_; ++i)
          if (std::atomic_ref<uint32_t>(scratch.flags_[i]).exchange(1u, std::memory_order_acquire) == 0u) {
            index_ = i;
            return;
          }
    }
    ~Lease() { std::atomic_ref<uint32_t>(scratch_.flags_[index_]).store(0u, std::memory_order_release); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    // The buffer (64-byte aligned), as T, from byte `offset` (keep it T-aligned).
    template <typename T>
    T* as(size_t offset = 0) const {
      return reinterpret_cast<T*>(scratch_.data_ + index_ * scratch_.stride_ + offset);
    }

   private:
    const ChunkScratch& scratch_;
    size_t index_ = 0;
  };

 private:
  static size_t round_up(size_t n) { return (n + 63) / 64 * 64; }

  size_t stride_;
  size_t count_;
  uint32_t* flags_;
  unsigned char* data_;
};

}  // namespace tessera::cpu
