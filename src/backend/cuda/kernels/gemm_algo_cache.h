// The GEMM algorithm cache: which cuBLASLt algorithm gemm() (gemm.h) runs for each
// problem. A choice is made once per process per key (the heuristic's first, or with
// TESSERA_GEMM_AUTOTUNE=1 the fastest of its candidates timed on first use) and then kept,
// so every later call of that GEMM runs the same kernel: results do not change from
// step to step. serialize() / deserialize() turn the cache into text, so a persistent
// compilation cache can store the choices and a later process skips the timing (and
// reproduces the earlier process's numbers bit for bit).
//
// A key names everything a choice depends on, including the GPU architecture and the
// cuBLASLt version: a choice read from text written elsewhere is simply never looked
// up. Choices read from text are re-validated (cublasLtMatmulAlgoCheck) before their
// first use. Thread-safe.
//
// Text format (one header line, then one line per entry, sorted by key):
//   tessera-gemm-algo-cache 1
//   m n k batch a_stride b_stride trans_a trans_b dtype compute epilogue align_a align_b
//     align_c align_bias align_aux sm library : algo0..algo7 (hex) workspace time_us
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace tessera::cuda {

struct GemmKey {
  // The problem as cuBLASLt sees it after batch folding (see gemm.h), in our row-major terms.
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // elements; 0: shared by every batch entry
  bool trans_a = false, trans_b = false;
  int dtype = 0;     // tessera DType of A, B, C (and the bias), as an integer
  int compute = 0;   // cublasComputeType_t
  int epilogue = 0;  // cublasLtEpilogue_t
  // Byte alignment (a power of two <= 256) of each buffer as the algorithm may assume it;
  // 0 where there is no such buffer.
  int align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
  int sm = 0;           // 10 * major + minor
  int64_t library = 0;  // cublasLtGetVersion()

  auto tie() const {
    return std::tie(m, n, k, batch, a_batch_stride, b_batch_stride, trans_a, trans_b, dtype, compute, epilogue, align_a,
                    align_b, align_c, align_bias, align_aux, sm, library);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
  bool operator==(const GemmKey& o) const { return tie() == o.tie(); }
  std::string text() const;  // the key's fields as in the text format
};

struct GemmChoice {
  std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t's bytes
  uint64_t workspace_bytes = 0;    // what the algorithm needs
  float time_us = -1;              // measured time per call; -1 when not timed
  bool verified = false;           // checked in this process (not serialized)

  bool operator==(const GemmChoice& o) const {
    return algo == o.algo && workspace_bytes == o.workspace_bytes && time_us == o.time_us;
  }
};

class GemmAlgoCache {
 public:
  std::optional<GemmChoice> find(const GemmKey& key) const;
  // Adds or replaces.
  void insert(const GemmKey& key, const GemmChoice& choice);
  void erase(const GemmKey& key);
  size_t size() const;
  void clear();

  std::string serialize() const;
  // Merges the entries of `text` (they replace entries with the same key, marked
  // unverified). Returns the number read. Malformed text is a ValueError naming the line,
  // and then nothing is merged.
  size_t deserialize(std::string_view text);

 private:
  mutable std::mutex mutex_;
  std::map<GemmKey, GemmChoice> entries_;
};

// The process-wide cache gemm() uses.
GemmAlgoCache& gemm_algo_cache();

}  // namespace tessera::cuda
