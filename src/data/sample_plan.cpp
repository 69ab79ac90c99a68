#include "tessera/data/sample_plan.h"

#include <cmath>
#include <numeric>

#include "data/random_draws.h"
#include "tessera/base/error.h"

namespace tessera::data {

using detail::splitmix64;
using detail::uniform_upto;

SourceOrder::SourceOrder(std::vector<uint64_t> shard_rows, uint64_t seed, uint32_t source, int64_t shuffle_buffer)
    : shard_rows_(std::move(shard_rows)),
      seed_(seed),
      source_(source),
      buffer_size_(shuffle_buffer > 1 ? static_cast<uint64_t>(shuffle_buffer) : 0) {
  total_ = std::accumulate(shard_rows_.begin(), shard_rows_.end(), uint64_t{0});
  if (total_ == 0) fail<ValueError>("SourceOrder: source {} has no rows", source);
  start_epoch(0);
}

void SourceOrder::start_epoch(uint64_t epoch) {
  epoch_ = epoch;
  emitted_ = 0;
  shard_cursor_ = 0;
  row_cursor_ = 0;
  buffer_.clear();
  rng_.seed(splitmix64(seed_ ^ splitmix64(uint64_t{source_} + 1) ^ splitmix64(epoch + (uint64_t{1} << 32))));
  shard_order_.clear();
  for (uint32_t k = 0; k < shard_rows_.size(); ++k)
    if (shard_rows_[k] > 0) shard_order_.push_back(k);
  if (buffer_size_ > 0)
    for (size_t i = shard_order_.size(); i > 1; --i)
      std::swap(shard_order_[i - 1], shard_order_[uniform_upto(rng_, i - 1)]);
}

RowRef SourceOrder::incoming() {
  const uint32_t shard = shard_order_[shard_cursor_];
  RowRef ref{source_, shard, row_cursor_};
  if (++row_cursor_ == shard_rows_[shard]) {
    ++shard_cursor_;
    row_cursor_ = 0;
  }
  return ref;
}

RowRef SourceOrder::next() {
  if (emitted_ == total_) start_epoch(epoch_ + 1);
  ++emitted_;
  if (buffer_size_ == 0) return incoming();
  while (buffer_.size() < buffer_size_ && has_incoming()) buffer_.push_back(incoming());
  const uint64_t j = uniform_upto(rng_, buffer_.size() - 1);
  const RowRef out = buffer_[j];
  if (has_incoming()) {
    buffer_[j] = incoming();
  } else {
    buffer_[j] = buffer_.back();
    buffer_.pop_back();
  }
  return out;
}

MixturePlan::MixturePlan(const std::vector<std::vector<uint64_t>>& shard_rows, const std::vector<double>& weights,
                         uint64_t seed, int64_t shuffle_buffer) {
  if (shard_rows.size() != weights.size() || shard_rows.empty())
    fail<ValueError>("MixturePlan: {} sources and {} weights", shard_rows.size(), weights.size());
  double sum = 0;
  for (double w : weights) {
    if (!std::isfinite(w) || w < 0) fail<ValueError>("MixturePlan: weight {} (expected a finite number >= 0)", w);
    sum += w;
  }
  if (!(sum > 0)) fail<ValueError>("MixturePlan: the weights sum to {} (expected a positive sum)", sum);
  constexpr double kScale = 1 << 20;
  for (uint32_t s = 0; s < shard_rows.size(); ++s) {
    int64_t w = std::llround(weights[s] / sum * kScale);
    if (weights[s] > 0 && w == 0) w = 1;
    weights_.push_back(w);
    total_weight_ += w;
    orders_.emplace_back(shard_rows[s], seed, s, shuffle_buffer);
  }
  credit_.assign(weights_.size(), 0);
  taken_.assign(weights_.size(), 0);
}

size_t MixturePlan::pick() {
  size_t best = 0;
  for (size_t s = 0; s < credit_.size(); ++s) {
    credit_[s] += weights_[s];
    if (credit_[s] > credit_[best]) best = s;
  }
  credit_[best] -= total_weight_;
  return best;
}

RowRef MixturePlan::next() {
  const size_t s = pick();
  ++taken_[s];
  ++planned_;
  return orders_[s].next();
}

void MixturePlan::skip(uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) next();
}

}  // namespace tessera::data
