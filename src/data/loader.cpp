#include "tessera/data/loader.h"

#include <numeric>

#include "data/random_draws.h"
#include "tessera/base/error.h"
#include "tessera/base/json_field.h"

namespace tessera::data {
using detail::splitmix64;
using detail::uniform_upto;

DataLoader::DataLoader(std::shared_ptr<const TokenFile> file, int64_t batch, int64_t seq, uint64_t seed, int rank,
                       int world, bool shuffle)
    : file_(std::move(file)), batch_(batch), seq_(seq), seed_(seed), rank_(rank), world_(world), shuffle_(shuffle) {
  if (!file_) fail<ValueError>("DataLoader: no token file");
  if (batch_ <= 0 || seq_ <= 0)
    fail<ValueError>("DataLoader {}: batch {} and seq {} must be positive", file_->path().string(), batch_, seq_);
  if (world_ <= 0 || rank_ < 0 || rank_ >= world_)
    fail<ValueError>("DataLoader {}: rank {} out of range for world size {}", file_->path().string(), rank_, world_);
  if (batches_per_epoch() == 0)
    fail<ValueError>(
        "DataLoader {}: {} tokens make {} windows of {} tokens (seq {} + 1), too few for one batch of {} on each of {} "
        "ranks (needs {} windows, {} tokens)",
        file_->path().string(), file_->size(), windows(), seq_ + 1, seq_, batch_, world_,
        static_cast<uint64_t>(batch_) * world_, static_cast<uint64_t>(batch_) * world_ * seq_ + 1);
  shuffle_epoch();
}

uint64_t DataLoader::windows() const {
  const uint64_t n = file_->size();
  return n == 0 ? 0 : (n - 1) / static_cast<uint64_t>(seq_);
}

uint64_t DataLoader::batches_per_epoch() const {
  return windows() / static_cast<uint64_t>(world_) / static_cast<uint64_t>(batch_);
}

void DataLoader::shuffle_epoch() {
  order_.resize(windows());
  std::iota(order_.begin(), order_.end(), uint64_t{0});
  order_epoch_ = position_.epoch;
  if (!shuffle_ || order_.size() < 2) return;
  std::mt19937_64 rng(splitmix64(seed_ ^ splitmix64(position_.epoch)));
  for (uint64_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[uniform_upto(rng, i)]);
}

void DataLoader::set_position(LoaderPosition position) {
  if (position.index >= batches_per_epoch())
    fail<ValueError>("DataLoader {}: position index {} out of range ({} batches per epoch)", file_->path().string(),
                     position.index, batches_per_epoch());
  position_ = position;
  if (order_epoch_ != position_.epoch) shuffle_epoch();
}

nlohmann::json DataLoader::position_json() const { return {{"epoch", position_.epoch}, {"index", position_.index}}; }

void DataLoader::restore_position(const nlohmann::json& position, const std::string& where) {
  const std::optional<uint64_t> epoch = json_field<uint64_t>(position, "epoch");
  const std::optional<uint64_t> index = json_field<uint64_t>(position, "index");
  if (!epoch || !index)
    fail<IOError>("resume: checkpoint {} has no data position (manifest extra.data.epoch/index, unsigned integers)",
                  where);
  set_position({*epoch, *index});
}

Batch DataLoader::next() { return next_rows(0, batch_); }

Batch DataLoader::next_rows(int64_t begin, int64_t end) {
  if (begin < 0 || end > batch_ || begin >= end)
    fail<ValueError>("DataLoader::next_rows: rows [{}, {}) of a batch of {}", begin, end, batch_);
  const auto b = static_cast<size_t>(batch_), s = static_cast<size_t>(seq_), w = static_cast<size_t>(world_);
  const auto rows = static_cast<size_t>(end - begin);
  std::vector<int32_t> window(s + 1), tokens(rows * s), targets(rows * s);
  for (size_t r = 0; r < rows; ++r) {
    const size_t j = static_cast<size_t>(begin) + r;
    const uint64_t slot = (position_.index * b + j) * w + static_cast<size_t>(rank_);
    file_->read(order_[slot] * s, s + 1, window.data());
    std::copy(window.begin(), window.end() - 1, tokens.begin() + r * s);
    std::copy(window.begin() + 1, window.end(), targets.begin() + r * s);
  }
  if (++position_.index == batches_per_epoch()) {
    position_ = LoaderPosition{position_.epoch + 1, 0};
    shuffle_epoch();
  }
  const Shape shape{end - begin, seq_};
  return Batch{Array::from_vector(tokens, shape), Array::from_vector(targets, shape)};
}

}  // namespace tessera::data
