// Deterministic batches of training windows from a token file. The file is cut into
// windows of seq + 1 tokens (stride seq); each epoch visits the windows in an order
// shuffled by (seed, epoch); data-parallel rank r of w takes every w-th window of
// that order. The position (epoch, next index) is all the state there is, so saving
// it in a checkpoint and restoring it resumes the exact same stream.
#pragma once

#include <cstdint>
#include <memory>

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
  Array targets;  // int32 [batch, seq] (tokens shifted by one)
};

class DataLoader {
 public:
  // A file too short for one batch of this rank is a ValueError giving the numbers.
  DataLoader(std::shared_ptr<const TokenFile> file, int64_t batch, int64_t seq, uint64_t seed, int rank = 0,
             int world = 1, bool shuffle = true);

  Batch next();  // wraps into the next epoch when this one is exhausted
  LoaderPosition position() const { return position_; }
  void set_position(LoaderPosition position);  // ValueError if out of range
  uint64_t batches_per_epoch() const;
  uint64_t windows() const;  // windows in the file (all ranks)

 private:
  std::shared_ptr<const TokenFile> file_;
  int64_t batch_, seq_;
  uint64_t seed_;
  int rank_, world_;
  bool shuffle_;
  LoaderPosition position_;
  std::vector<uint64_t> order_;  // this epoch's window order
  void shuffle_epoch();
};

}  // namespace tessera::data
