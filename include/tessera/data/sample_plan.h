// Which row comes next: the mixture over sources and each source's shuffled order. Only
// indices are computed here (no token is read), so the plan is cheap to replay: a
// pipeline's position is the number of rows planned, and a resume replays that many.
//
// A source's order in epoch e: its shards in an order shuffled by (seed, source, e), the
// rows of each shard in turn, through a shuffle buffer of B row indices (full: the next
// row replaces a uniformly drawn one, which is emitted; at the epoch's end the buffer
// drains in random order). Every row is emitted exactly once per epoch. B <= 1: the rows
// in shard order, shards unshuffled. Draws: std::mt19937_64 seeded with
// splitmix64(seed ^ splitmix64(source + 1) ^ splitmix64(epoch + 2^32)), uniform by
// rejection (data/random_draws.h).
//
// The mixture: smooth weighted round-robin over integer weights (each weight / sum
// scaled to 2^20, at least 1 when positive): every pick adds each source's weight to
// its credit and takes the source with the most credit (the first on ties), which then
// pays the total. After n picks each source has been taken within one row of
// n * weight / sum, at every n.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tessera/data/source.h"

namespace tessera::data {

class SourceOrder {
 public:
  SourceOrder(std::vector<uint64_t> shard_rows, uint64_t seed, uint32_t source, int64_t shuffle_buffer);
  RowRef next();
  uint64_t epoch() const { return epoch_; }
  uint64_t rows_per_epoch() const { return total_; }

 private:
  std::vector<uint64_t> shard_rows_;
  uint64_t seed_, total_ = 0;
  uint32_t source_;
  uint64_t buffer_size_;
  uint64_t epoch_ = 0, emitted_ = 0;
  std::vector<uint32_t> shard_order_;
  size_t shard_cursor_ = 0;
  uint64_t row_cursor_ = 0;
  std::vector<RowRef> buffer_;
  std::mt19937_64 rng_;
  void start_epoch(uint64_t epoch);
  bool has_incoming() const { return shard_cursor_ < shard_order_.size(); }
  RowRef incoming();
};

class MixturePlan {
 public:
  // shard_rows[s]: the rows of each shard of source s; weights[s] >= 0 with a positive sum.
  MixturePlan(const std::vector<std::vector<uint64_t>>& shard_rows, const std::vector<double>& weights, uint64_t seed,
              int64_t shuffle_buffer);
  RowRef next();
  void skip(uint64_t n);
  uint64_t planned() const { return planned_; }
  const std::vector<uint64_t>& taken() const { return taken_; }  // rows taken from each source
  uint64_t epoch(size_t source) const { return orders_[source].epoch(); }
  const std::vector<int64_t>& integer_weights() const { return weights_; }

 private:
  std::vector<SourceOrder> orders_;
  std::vector<int64_t> weights_, credit_;
  int64_t total_weight_ = 0;
  std::vector<uint64_t> taken_;
  uint64_t planned_ = 0;
  size_t pick();
};

}  // namespace tessera::data
