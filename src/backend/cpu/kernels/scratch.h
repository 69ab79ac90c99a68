// Per-thread, grow-only scratch buffers for kernels: a compiled program's runs must not
// allocate, so kernels take their temporary buffers from here instead of std::vector.
// A buffer grows (once, on the first call that needs the size) and is then reused by
// every later call on the same thread; it is freed when the thread exits.
//
// Slots: a buffer stays valid until the next thread_scratch call with the same slot on
// the same thread, so buffers alive at the same time need distinct slots. The thread
// calling parallel_for runs chunks too, so a buffer taken around a parallel_for and one
// taken inside its body must use different slots. Each kernel file uses its own slots
// (listed below), so kernels calling each other never share one.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace tessera::cpu {

enum class Scratch : int {
  ReducePartials,      // reduce.cpp: block partials around a parallel_for
  ReduceGroupPartial,  // reduce.cpp: a trailing-group partial result
  ReducePermuted,      // reduce.cpp: the permuted copy
  ReduceRow,           // reduce.cpp: block partials of one long row (inside parallel_for)
  ReduceColumnBlock,   // reduce.cpp: column block accumulators (inside parallel_for)
  ReduceColumnStack,   // reduce.cpp: column pairwise stack (inside parallel_for)
  ArgReduceBest,       // reduce.cpp: arg max/min running best (inside parallel_for)
  FusedPartials,       // fused_elementwise.cpp: fused reduction block partials
  NormWeight,          // norm.cpp: the weight widened to the accumulator type
  NormBias,            // norm.cpp: the bias widened to the accumulator type
  NormOnes,            // norm.cpp: a unit weight
  NormWeightGrad,      // norm.cpp: per-chunk weight-gradient partials
  NormBiasGrad,        // norm.cpp: per-chunk bias-gradient partials
  AttentionDelta,      // attention_backward.cpp: rowwise delta (inside parallel_for)
  AttentionDq,         // attention_backward.cpp: dq partials (inside parallel_for)
  GatherIndices,       // gather.cpp: normalized indices
  MatmulA,             // matmul.cpp: widened 16-bit panels of a
  MatmulB,             // matmul.cpp: widened 16-bit panels of b
  MatmulC,             // matmul.cpp: float32 result of the widened product
  MatmulAcc,           // matmul.cpp: integer row accumulators (inside parallel_for)
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

}  // namespace tessera::cpu
