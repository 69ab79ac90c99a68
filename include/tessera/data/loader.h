// Deterministic batches of training windows from a token file. The file is cut into
// windows of seq + 1 tokens (stride seq); each epoch visits the windows in an order
// shuffled by (seed, epoch); data-parallel rank r of w takes every w-th window of
// that order. The position (epoch, next index) is all the state there is, so saving
// it in a checkpoint and restoring it resumes the exact same stream.
//
// Exactly: with W windows and world w, every rank takes W / w windows per epoch (the
// last W % w of the order are left for that epoch, a different few each epoch) and
// batches_per_epoch = (W / w) / batch. Batch b of rank r in epoch e holds windows
// order_e[(b * batch + j) * w + r] for j in [0, batch). Window i is tokens
// [i * seq, i * seq + seq]; tokens are its first seq, targets its last seq.
//
// order_e is the identity without shuffle; with shuffle it is a Fisher-Yates shuffle
// (i from W-1 down to 1, swap i with j uniform in [0, i] by rejection sampling) driven by
// std::mt19937_64 seeded with splitmix64(seed ^ splitmix64(epoch)). Both are fully
// specified by the standard and here, so the stream is the same on every platform
// (std::shuffle's algorithm is implementation-defined, so it is not used).
//
// Validation: DataLoader(val_file, batch, seq, seed, rank, world, /*shuffle=*/false)
// visits the windows in file order; batches_per_epoch() batches cover the split once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/core/array.h"
#include "tessera/data/token_file.h"

namespace tessera::data {

struct LoaderPosition {
  uint64_t epoch = 0;
  uint64_t index = 0;  // batches already taken in this epoch by this rank
  bool operator==(const LoaderPosition&) const = default;
};

struct Batch {
  Array tokens;   // int32 [batch, seq]
  Array targets;  // int32 [batch, seq] (tokens shifted by one; -100: no target, left out of the loss)
  // Packed documents (data/pipeline.h): int32 [batch, seq] each. A token attends only to
  // earlier tokens of its own segment (its document); positions restart at 0 at every
  // document start. Absent for plain windows: one segment, positions 0..seq-1.
  // (Default initializers: Batch{tokens, targets} stays warning-free.)
  std::optional<Array> segments = std::nullopt, positions = std::nullopt;
};

class DataLoader {
 public:
  // A file too short for one batch of this rank is a ValueError giving the numbers.
  DataLoader(std::shared_ptr<const TokenFile> file, int64_t batch, int64_t seq, uint64_t seed, int rank = 0,
             int world = 1, bool shuffle = true);

  Batch next();  // wraps into the next epoch when this one is exhausted
  // Rows [begin, end) of what next() would return (and the same advance): a
  // data-parallel process reads only its own slice of the global batch.
  Batch next_rows(int64_t begin, int64_t end);
  LoaderPosition position() const { return position_; }
  void set_position(LoaderPosition position);  // ValueError if out of range
  uint64_t batches_per_epoch() const;
  uint64_t windows() const;  // windows in the file (all ranks)
  int64_t batch_size() const { return batch_; }
  int64_t seq() const { return seq_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  int64_t batch_, seq_;
  uint64_t seed_;
  int rank_, world_;
  bool shuffle_;
  LoaderPosition position_;
  std::vector<uint64_t> order_;  // the window order of order_epoch_
  uint64_t order_epoch_ = 0;
  void shuffle_epoch();  // order_ for position_.epoch
};

}  // namespace tessera::data
