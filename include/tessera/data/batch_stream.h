// What a trainer draws batches from: a DataLoader (one token file, data/loader.h) or a
// Pipeline (mixtures, packing, workers, data/pipeline.h). The position is all the state
// a checkpoint needs: restoring it resumes the exact same stream.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tessera/core/array.h"

namespace tessera::data {

struct Batch {
  Array tokens;   // int32 [batch, seq]
  Array targets;  // int32 [batch, seq] (tokens shifted by one; -100: no target, left out of the loss)
  // Packed documents (data/pipeline.h): int32 [batch, seq] each. A token attends only to
  // earlier tokens of its own segment (its document); positions restart at 0 at every
  // document start. Absent for plain windows: one segment, positions 0..seq-1.
  std::optional<Array> segments = std::nullopt, positions = std::nullopt;
};

class BatchStream {
 public:
  virtual ~BatchStream() = default;
  // Rows [begin, end) of the next batch (and the same advance as taking all of it): a
  // data-parallel process reads only its own slice of the global batch.
  virtual Batch next_rows(int64_t begin, int64_t end) = 0;
  Batch next_batch() { return next_rows(0, batch_size()); }
  virtual int64_t batch_size() const = 0;
  virtual int64_t seq() const = 0;
  // The position as the checkpoint manifest stores it (extra.data), and back: a position
  // that does not fit this stream is an IOError naming `where` (the checkpoint).
  virtual nlohmann::json position_json() const = 0;
  virtual void restore_position(const nlohmann::json& position, const std::string& where) = 0;
};

}  // namespace tessera::data
