// DataLoader: windows, the documented shuffle (re-implemented here as the reference),
// rank sharding, epoch wrap-around and exact resume from a saved position.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/loader.h"

namespace tessera::data {
namespace {

using tessera::testing::TempDir;

// Token i of the file is i, so a window is identified by its first token / seq.
std::shared_ptr<const TokenFile> counting_file(const TempDir& dir, int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  write_token_file(dir / "count.bin", tokens, "test", 1 << 20);
  return std::make_shared<const TokenFile>(dir / "count.bin");
}

// The order documented in loader.h, written independently.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
std::vector<uint64_t> reference_order(uint64_t windows, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> order(windows);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::mt19937_64 rng(mix(seed ^ mix(epoch)));
  for (uint64_t i = windows - 1; i > 0; --i) {
    // Rejection sampling: accept draws below the largest multiple of i + 1 that fits in 2^64.
    const uint64_t range = i + 1;
    const uint64_t limit = UINT64_MAX - (0 - range) % range;
    uint64_t draw;
    do draw = rng();
    while (draw > limit);
    std::swap(order[i], order[draw % range]);
  }
  return order;
}

// Window index of each row of a batch; checks the rows are windows and targets are shifted tokens.
std::vector<uint64_t> window_ids(const Batch& batch, int64_t seq) {
  const std::vector<int32_t> tokens = batch.tokens.to_vector<int32_t>();
  const std::vector<int32_t> targets = batch.targets.to_vector<int32_t>();
  EXPECT_EQ(batch.tokens.dtype(), DType::Int32);
  EXPECT_EQ(batch.tokens.shape(), (Shape{static_cast<int64_t>(tokens.size()) / seq, seq}));
  std::vector<uint64_t> ids;
  for (size_t row = 0; row * seq < tokens.size(); ++row) {
    const int32_t first = tokens[row * seq];
    EXPECT_EQ(first % seq, 0);
    for (int64_t k = 0; k < seq; ++k) {
      EXPECT_EQ(tokens[row * seq + k], first + k);
      EXPECT_EQ(targets[row * seq + k], first + k + 1);
    }
    ids.push_back(static_cast<uint64_t>(first / seq));
  }
  return ids;
}

TEST(DataLoader, FollowsTheDocumentedOrderAndShardsRanks) {
  TempDir dir;
  const int64_t seq = 8, batch = 2;
  const int world = 3;
  auto file = counting_file(dir, 12 * seq * world + 5);  // 36 windows, 4 left over tokens
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(file, batch, seq, /*seed=*/42, r, world);
  EXPECT_EQ(ranks[0].windows(), 36u);
  EXPECT_EQ(ranks[0].batches_per_epoch(), 6u);

  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<uint64_t> order = reference_order(36, 42, epoch);
    std::multiset<uint64_t> seen;
    for (int r = 0; r < world; ++r) {
      for (uint64_t b = 0; b < 6; ++b) {
        EXPECT_EQ(ranks[r].position(), (LoaderPosition{epoch, b}));
        const std::vector<uint64_t> ids = window_ids(ranks[r].next(), seq);
        for (size_t j = 0; j < ids.size(); ++j) {
          EXPECT_EQ(ids[j], order[(b * batch + j) * world + r]) << "epoch " << epoch << " rank " << r << " batch " << b;
          seen.insert(ids[j]);
        }
      }
    }
    // Ranks are disjoint and together cover every window exactly once per epoch.
    std::multiset<uint64_t> all;
    for (uint64_t w = 0; w < 36; ++w) all.insert(w);
    EXPECT_EQ(seen, all);
  }
  EXPECT_EQ(ranks[0].position(), (LoaderPosition{2, 0}));
}

TEST(DataLoader, DeterministicAndEpochsDiffer) {
  TempDir dir;
  auto file = counting_file(dir, 4097);
  DataLoader a(file, 4, 16, 7), b(file, 4, 16, 7), other_seed(file, 4, 16, 8);
  std::vector<uint64_t> epoch0, epoch1, seed8;
  const uint64_t per_epoch = a.batches_per_epoch();
  ASSERT_EQ(per_epoch, 64u);
  for (uint64_t i = 0; i < per_epoch; ++i) {
    const Batch x = a.next(), y = b.next();
    EXPECT_EQ(x.tokens.to_vector<int32_t>(), y.tokens.to_vector<int32_t>());
    for (uint64_t id : window_ids(x, 16)) epoch0.push_back(id);
    for (uint64_t id : window_ids(other_seed.next(), 16)) seed8.push_back(id);
  }
  for (uint64_t i = 0; i < per_epoch; ++i)
    for (uint64_t id : window_ids(a.next(), 16)) epoch1.push_back(id);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch0, seed8);
  std::vector<uint64_t> sorted0 = epoch0, sorted1 = epoch1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_EQ(sorted0, sorted1);  // both are permutations of all 256 windows
  EXPECT_EQ(sorted0.size(), 256u);
  EXPECT_EQ(std::adjacent_find(sorted0.begin(), sorted0.end()), sorted0.end());
}

TEST(DataLoader, PositionRoundTripResumesTheSameStream) {
  TempDir dir;
  auto file = counting_file(dir, 1001);
  DataLoader original(file, 3, 10, 99, 1, 2);  // 100 windows, 50 per rank, 16 batches
  ASSERT_EQ(original.batches_per_epoch(), 16u);
  for (int i = 0; i < 13; ++i) original.next();
  const LoaderPosition saved = original.position();
  EXPECT_EQ(saved, (LoaderPosition{0, 13}));
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 8; ++i) expected.push_back(original.next().tokens.to_vector<int32_t>());  // crosses into epoch 1

  DataLoader resumed(file, 3, 10, 99, 1, 2);
  resumed.next();  // whatever it did before does not matter
  resumed.set_position(saved);
  EXPECT_EQ(resumed.position(), saved);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(resumed.next().tokens.to_vector<int32_t>(), expected[i]) << i;

  // Resuming directly into a later epoch.
  DataLoader later(file, 3, 10, 99, 1, 2);
  later.set_position({0, 15});
  later.next();
  const LoaderPosition epoch1 = later.position();
  EXPECT_EQ(epoch1, (LoaderPosition{1, 0}));
  DataLoader jump(file, 3, 10, 99, 1, 2);
  jump.set_position(epoch1);
  EXPECT_EQ(jump.next().tokens.to_vector<int32_t>(), later.next().tokens.to_vector<int32_t>());

  EXPECT_THROW(jump.set_position({0, 16}), ValueError);
}

TEST(DataLoader, WithoutShuffleVisitsTheFileInOrder) {
  TempDir dir;
  auto file = counting_file(dir, 8 * 10 + 1);
  DataLoader val(file, 2, 8, 0, 0, 1, /*shuffle=*/false);
  ASSERT_EQ(val.batches_per_epoch(), 5u);
  for (uint64_t epoch = 0; epoch < 2; ++epoch)
    for (uint64_t b = 0; b < 5; ++b) EXPECT_EQ(window_ids(val.next(), 8), (std::vector<uint64_t>{2 * b, 2 * b + 1}));
}

TEST(DataLoader, TooShortFileSaysWhy) {
  TempDir dir;
  auto file = counting_file(dir, 40);
  try {
    DataLoader loader(file, 4, 16, 0);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("40 tokens"), std::string::npos) << message;
    EXPECT_NE(message.find("2 windows"), std::string::npos) << message;
  }
  EXPECT_THROW(DataLoader(file, 1, 8, 0, 2, 2), ValueError);  // rank out of range
  EXPECT_THROW(DataLoader(file, 0, 8, 0), ValueError);
}

}  // namespace
}  // namespace tessera::data
