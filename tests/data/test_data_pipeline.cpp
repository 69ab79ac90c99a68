// The data pipeline: mixture weights realized, packing that never lets a segment (what
// attention sees) span two documents, the same batches for every worker count, exact
// resume, rank sharding, the bounded shuffle buffer, text sources, and errors that name
// the source.
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/pipeline.h"
#include "tessera/data/sample_plan.h"

namespace tessera::data {
namespace {

using tessera::testing::TempDir;

constexpr int32_t kSeparator = 7;  // ends every document of the synthetic sources
constexpr int64_t kVocab = int64_t{1} << 30;

// A synthetic source: documents of 1..max_len content tokens, each followed by
// kSeparator. Content token at stream index i is base + i, so a token names its index;
// doc_of[i] is the document of index i (a separator belongs to the document it ends).
struct Synthetic {
  std::vector<int32_t> tokens;
  std::vector<int64_t> doc_of;
  int32_t base = 0;
};

Synthetic synthetic(int32_t base, int64_t documents, int max_len, uint64_t seed) {
  Synthetic s;
  s.base = base;
  std::mt19937_64 rng(seed);
  for (int64_t d = 0; d < documents; ++d) {
    const int len = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_len));
    for (int i = 0; i < len; ++i) {
      s.tokens.push_back(base + static_cast<int32_t>(s.tokens.size()));
      s.doc_of.push_back(d);
    }
    s.tokens.push_back(kSeparator);
    s.doc_of.push_back(d);
  }
  return s;
}

std::string write(const TempDir& dir, const std::string& name, const std::vector<int32_t>& tokens,
                  const std::string& tokenizer = "byte") {
  const auto path = dir / name;
  std::filesystem::create_directories(path.parent_path());
  write_token_file(path, tokens, tokenizer, kVocab);
  return path.string();
}

const Tokenizer& byte_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("byte");
  return *tokenizer;
}

PipelineSpec two_sources(const std::string& a, const std::string& b, double wa, double wb) {
  PipelineSpec spec;
  spec.sources = {{"a", a, wa, "tokens", std::to_string(kSeparator)},
                  {"b", b, wb, "tokens", std::to_string(kSeparator)}};
  return spec;
}

std::vector<int32_t> ints(const Array& a) { return a.to_vector<int32_t>(); }

void expect_same(const Batch& x, const Batch& y, const std::string& what) {
  ASSERT_EQ(ints(x.tokens), ints(y.tokens)) << what;
  ASSERT_EQ(ints(x.targets), ints(y.targets)) << what;
  ASSERT_EQ(x.segments.has_value(), y.segments.has_value()) << what;
  if (x.segments) {
    ASSERT_EQ(ints(*x.segments), ints(*y.segments)) << what;
    ASSERT_EQ(ints(*x.positions), ints(*y.positions)) << what;
  }
}

class PipelineTest : public ::testing::Test {
 protected:
  TempDir dir;
  Synthetic a = synthetic(1000, 400, 40, 1), b = synthetic(100'000'000, 300, 90, 2);
  std::string path_a = write(dir, "a.bin", a.tokens), path_b = write(dir, "b/shard0.bin", b.tokens);
};

TEST_F(PipelineTest, MixtureRealizesItsWeightsOverAMillionTokens) {
  // Small sources, so the million tokens run through several epochs of each.
  const int64_t seq = 64, batch = 16;
  Pipeline pipeline(two_sources(path_a, path_b, 0.7, 0.3), byte_tokenizer(), batch, seq, 5, 0, 1, kVocab);
  uint64_t tokens = 0, from_a = 0;
  while (tokens < 1'000'000) {
    const Batch batch_ = pipeline.next_batch();
    const std::vector<int32_t> t = ints(batch_.tokens);
    for (int64_t r = 0; r < batch; ++r) {
      // A row is from a when its tokens are a's (separators aside).
      const int32_t probe = t[static_cast<size_t>(r * seq)] == kSeparator ? t[static_cast<size_t>(r * seq + 1)]
                                                                          : t[static_cast<size_t>(r * seq)];
      from_a += probe < 100'000'000 ? static_cast<uint64_t>(seq) : 0;
    }
    tokens += static_cast<uint64_t>(batch * seq);
  }
  const double realized = static_cast<double>(from_a) / static_cast<double>(tokens);
  EXPECT_NEAR(realized, 0.7, 0.007) << "realized " << realized << " of source a over " << tokens << " tokens";
  const std::vector<SourceStats> stats = pipeline.stats();
  EXPECT_EQ(stats[0].tokens, from_a);
  EXPECT_EQ(stats[0].tokens + stats[1].tokens, tokens);
  EXPECT_GT(stats[0].epoch, 2u);  // the test ran through epochs
}

// Every row of a packed batch: a segment is exactly one document's tokens (a token attends
// only inside its segment), positions restart at each document, and no target crosses.
TEST_F(PipelineTest, PackingNeverLetsASegmentSpanTwoDocuments) {
  const int64_t seq = 48, batch = 8;
  Pipeline pipeline(two_sources(path_a, path_b, 1, 1), byte_tokenizer(), batch, seq, 3, 0, 1, kVocab);
  int64_t rows_with_several_documents = 0;
  for (int step = 0; step < 60; ++step) {
    const Batch x = pipeline.next_batch();
    ASSERT_TRUE(x.segments && x.positions);
    const std::vector<int32_t> t = ints(x.tokens), y = ints(x.targets), seg = ints(*x.segments),
                               pos = ints(*x.positions);
    for (int64_t r = 0; r < batch; ++r) {
      const size_t o = static_cast<size_t>(r * seq);
      const bool second = t[o] == kSeparator;
      const int32_t probe = second ? t[o + 1] : t[o];
      const Synthetic& src = probe < 100'000'000 ? a : b;
      const int64_t start = probe - src.base - (second ? 1 : 0);  // stream index of the row's first token
      std::map<int32_t, int64_t> document_of_segment;
      int64_t first_of_doc = 0;
      for (int64_t i = 0; i < seq; ++i) {
        const size_t k = o + static_cast<size_t>(i);
        const int64_t doc = src.doc_of[static_cast<size_t>(start + i)];
        if (i == 0 || doc != src.doc_of[static_cast<size_t>(start + i - 1)]) first_of_doc = i;
        auto [it, inserted] = document_of_segment.emplace(seg[k], doc);
        ASSERT_EQ(it->second, doc) << "segment " << seg[k] << " holds two documents (row " << r << ", token " << i
                                   << ")";
        if (i > 0) {
          ASSERT_EQ(seg[k] == seg[k - 1], doc == src.doc_of[static_cast<size_t>(start + i - 1)])
              << "a document split into segments, or two joined, at token " << i;
        }
        EXPECT_EQ(pos[k], i - first_of_doc);
        const bool crosses = src.doc_of[static_cast<size_t>(start + i + 1)] != doc;
        EXPECT_EQ(y[k], crosses ? -100 : src.tokens[static_cast<size_t>(start + i + 1)]) << "target of token " << i;
        EXPECT_EQ(t[k], src.tokens[static_cast<size_t>(start + i)]);
      }
      rows_with_several_documents += document_of_segment.size() > 1;
    }
  }
  EXPECT_GT(rows_with_several_documents, 100);  // the rows did pack documents
}

TEST_F(PipelineTest, ConcatPackingGivesPlainWindows) {
  PipelineSpec spec = two_sources(path_a, path_b, 1, 0);
  spec.packing = "concat";
  spec.shuffle_buffer = 0;
  Pipeline pipeline(spec, byte_tokenizer(), 2, 16, 3, 0, 1, kVocab);
  const Batch x = pipeline.next_batch();
  EXPECT_FALSE(x.segments.has_value());
  const std::vector<int32_t> t = ints(x.tokens), y = ints(x.targets);
  // No shuffle: rows 0 and 1 of source a in order, targets the next tokens (across documents).
  for (size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(t[i], a.tokens[i]);
    EXPECT_EQ(y[i], a.tokens[i + 1]);
  }
}

TEST_F(PipelineTest, EveryWorkerCountGivesBitwiseTheSameBatches) {
  const int64_t seq = 32, batch = 4;
  std::vector<Batch> reference;
  {
    PipelineSpec spec = two_sources(path_a, path_b, 2, 1);
    spec.workers = 0;
    Pipeline pipeline(spec, byte_tokenizer(), batch, seq, 11, 0, 1, kVocab);
    for (int i = 0; i < 80; ++i) reference.push_back(pipeline.next_batch());
  }
  for (int workers : {1, 2, 4}) {
    PipelineSpec spec = two_sources(path_a, path_b, 2, 1);
    spec.workers = workers;
    spec.prefetch = 3;
    Pipeline pipeline(spec, byte_tokenizer(), batch, seq, 11, 0, 1, kVocab);
    for (int i = 0; i < 80; ++i)
      expect_same(pipeline.next_batch(), reference[static_cast<size_t>(i)],
                  "workers " + std::to_string(workers) + ", batch " + std::to_string(i));
  }
}

TEST_F(PipelineTest, ResumeMidEpochContinuesBitwiseForAnyWorkerCount) {
  const int64_t seq = 32, batch = 4;
  auto make = [&](int workers) {
    PipelineSpec spec = two_sources(path_a, path_b, 1, 1);
    spec.workers = workers;
    spec.shuffle_buffer = 64;
    return std::make_unique<Pipeline>(spec, byte_tokenizer(), batch, seq, 9, 0, 1, kVocab);
  };
  std::vector<Batch> straight;
  {
    auto pipeline = make(2);
    for (int i = 0; i < 300; ++i) straight.push_back(pipeline->next_batch());
    EXPECT_GT(pipeline->stats()[0].epoch, 0u);  // the run crossed an epoch of a
  }
  for (int cut : {1, 37, 150}) {
    nlohmann::json position;
    {
      auto first = make(2);  // prefetches past the cut: the position is what was consumed
      for (int i = 0; i < cut; ++i) first->next_batch();
      position = first->position_json();
    }
    for (int workers : {0, 4}) {
      auto resumed = make(workers);
      resumed->restore_position(position, "test");
      for (int i = cut; i < 300; ++i)
        expect_same(
            resumed->next_batch(), straight[static_cast<size_t>(i)],
            "cut " + std::to_string(cut) + ", workers " + std::to_string(workers) + ", batch " + std::to_string(i));
    }
  }
}

TEST_F(PipelineTest, RestoreRefusesAnotherStream) {
  Pipeline one(two_sources(path_a, path_b, 1, 1), byte_tokenizer(), 4, 32, 9, 0, 1, kVocab);
  one.next_batch();
  const nlohmann::json position = one.position_json();
  Pipeline other(two_sources(path_a, path_b, 1, 2), byte_tokenizer(), 4, 32, 9, 0, 1, kVocab);
  EXPECT_THROW(
      {
        try {
          other.restore_position(position, "ckpt-7");
        } catch (const IOError& e) {
          EXPECT_NE(std::string(e.what()).find("ckpt-7"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("another data stream"), std::string::npos) << e.what();
          throw;
        }
      },
      IOError);
  EXPECT_THROW(other.restore_position({{"epoch", 0}, {"index", 3}}, "old"), IOError);
}

TEST_F(PipelineTest, RanksSplitTheGlobalStream) {
  const int64_t seq = 16, batch = 3, world = 3;
  PipelineSpec spec = two_sources(path_a, path_b, 1, 1);
  Pipeline whole(spec, byte_tokenizer(), batch * world, seq, 4, 0, 1, kVocab);
  std::vector<std::unique_ptr<Pipeline>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::make_unique<Pipeline>(spec, byte_tokenizer(), batch, seq, 4, r, world, kVocab));
  for (int step = 0; step < 20; ++step) {
    const std::vector<int32_t> all = ints(whole.next_batch().tokens);
    for (int r = 0; r < world; ++r) {
      const std::vector<int32_t> mine = ints(ranks[static_cast<size_t>(r)]->next_batch().tokens);
      for (int64_t j = 0; j < batch; ++j)
        for (int64_t i = 0; i < seq; ++i)
          ASSERT_EQ(mine[static_cast<size_t>(j * seq + i)], all[static_cast<size_t>((j * world + r) * seq + i)])
              << "rank " << r << " row " << j;
    }
  }
}

TEST_F(PipelineTest, NextRowsIsASliceOfTheBatch) {
  PipelineSpec spec = two_sources(path_a, path_b, 1, 1);
  Pipeline whole(spec, byte_tokenizer(), 6, 16, 4, 0, 1, kVocab), part(spec, byte_tokenizer(), 6, 16, 4, 0, 1, kVocab);
  for (int step = 0; step < 10; ++step) {
    const std::vector<int32_t> all = ints(whole.next_batch().tokens);
    const std::vector<int32_t> slice = ints(part.next_rows(2, 5).tokens);
    ASSERT_EQ(slice, std::vector<int32_t>(all.begin() + 2 * 16, all.begin() + 5 * 16));
  }
}

TEST(SourceOrderTest, EveryRowOncePerEpochAndNeverFurtherThanTheBuffer) {
  const std::vector<uint64_t> shard_rows = {50, 0, 120, 30};
  const uint64_t total = 200, buffer = 16;
  SourceOrder order(shard_rows, 77, 0, static_cast<int64_t>(buffer));
  std::vector<std::vector<RowRef>> epochs(3);
  for (auto& epoch : epochs)
    for (uint64_t i = 0; i < total; ++i) epoch.push_back(order.next());
  for (size_t e = 0; e < epochs.size(); ++e) {
    std::set<std::pair<uint32_t, uint64_t>> seen;
    // The rows in the order they enter the buffer: the epoch's shard order, each shard's rows in turn.
    std::vector<uint32_t> shard_order;
    for (const RowRef& r : epochs[e])
      if (std::find(shard_order.begin(), shard_order.end(), r.shard) == shard_order.end())
        shard_order.push_back(r.shard);
    for (const RowRef& r : epochs[e]) {
      EXPECT_TRUE(seen.insert({r.shard, r.row}).second) << "row repeated in epoch " << e;
      EXPECT_LT(r.row, shard_rows[r.shard]);
    }
    EXPECT_EQ(seen.size(), total);
    // The p-th row to enter the buffer (shards in the epoch's order, each shard's rows in
    // turn) leaves at output index i >= p - (buffer - 1): the buffer holds the rest.
    for (size_t i = 0; i < epochs[e].size(); ++i) {
      const RowRef& r = epochs[e][i];
      uint64_t ahead = 0;
      for (uint32_t s : shard_order) {
        if (s == r.shard) break;
        ahead += shard_rows[s];
      }
      EXPECT_LT(ahead + r.row, i + buffer) << "row emitted before it could be in the buffer";
    }
  }
  EXPECT_NE(epochs[0], epochs[1]);
  SourceOrder plain(shard_rows, 77, 0, 0);
  for (uint64_t i = 0; i < total; ++i) {
    const RowRef r = plain.next();
    const uint64_t flat = (r.shard == 0 ? 0 : r.shard == 2 ? 50 : 170) + r.row;
    ASSERT_EQ(flat, i) << "without a buffer the rows come in file order";
  }
}

TEST(MixturePlanTest, EveryPrefixIsWithinOneRowOfTheWeights) {
  MixturePlan plan({{1000}, {1000}, {1000}}, {0.5, 0.3, 0.2}, 1, 0);
  for (uint64_t n = 1; n <= 5000; ++n) {
    plan.next();
    for (size_t s = 0; s < 3; ++s) {
      const double want = static_cast<double>(n) * std::array<double, 3>{0.5, 0.3, 0.2}[s];
      ASSERT_LE(std::abs(static_cast<double>(plan.taken()[s]) - want), 1.0) << "after " << n << " rows, source " << s;
    }
  }
}

TEST(PipelineTextTest, TextSourcesAreTokenizedWithOneDocumentPerFile) {
  TempDir dir;
  tessera::testing::write_bytes(dir / "notes/a.txt", std::string(40, 'a') + "\n");
  tessera::testing::write_bytes(dir / "notes/b.txt", std::string(25, 'b') + "\n");
  tessera::testing::write_bytes(dir / "notes/c.txt", std::string(60, 'c') + "\n");
  PipelineSpec spec;
  spec.sources = {{"", (dir / "notes").string(), 1.0, "auto", "auto"}};
  spec.shuffle_buffer = 0;
  Pipeline pipeline(spec, byte_tokenizer(), 1, 32, 1);
  EXPECT_EQ(pipeline.sources()[0]->kind(), "text");
  EXPECT_EQ(pipeline.sources()[0]->name(), "notes");
  EXPECT_EQ(pipeline.sources()[0]->tokens(), 41u + 26 + 61);
  EXPECT_EQ(pipeline.sources()[0]->documents(), 3u);
  // Row 1 is stream tokens [32, 64]: a's last 9 then b's 26 (a ends at 41).
  pipeline.next_batch();
  const Batch row = pipeline.next_batch();
  const std::vector<int32_t> t = ints(row.tokens), seg = ints(*row.segments), pos = ints(*row.positions);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(t[static_cast<size_t>(i)], i < 8 ? 'a' : i == 8 ? '\n' : 'b') << i;
    EXPECT_EQ(seg[static_cast<size_t>(i)], i < 9 ? 1 : 2) << i;
    EXPECT_EQ(pos[static_cast<size_t>(i)], i < 9 ? i : i - 9) << i;
  }
  EXPECT_EQ(ints(row.targets)[8], -100);  // a's last token has no target in b
}

// ---- bad input: errors that name the source ----

template <typename E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& mentions) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const E& e) {
    for (const std::string& m : mentions)
      EXPECT_NE(std::string(e.what()).find(m), std::string::npos) << "'" << m << "' not in: " << e.what();
  }
}

TEST_F(PipelineTest, BadSpecsAreClearErrors) {
  const Tokenizer& tok = byte_tokenizer();
  expect_error<ConfigError>([&] { Pipeline(two_sources(path_a, path_b, 0, 0), tok, 2, 16, 1, 0, 1, kVocab); },
                            {"sum to 0", "'a' = 0", "'b' = 0"});
  expect_error<ConfigError>([&] { Pipeline(two_sources(path_a, path_b, 1, -2), tok, 2, 16, 1, 0, 1, kVocab); },
                            {"'b'", "weight -2"});
  expect_error<ConfigError>(
      [&] {
        PipelineSpec spec = two_sources(path_a, path_b, 1, 1);
        spec.packing = "pack";
        Pipeline(spec, tok, 2, 16, 1, 0, 1, kVocab);
      },
      {"data.packing", "'pack'"});
  expect_error<ConfigError>([&] { Pipeline(PipelineSpec{}, tok, 2, 16, 1); }, {"no sources"});
}

TEST_F(PipelineTest, BadSourcesAreClearErrorsNamingTheSource) {
  const Tokenizer& tok = byte_tokenizer();
  const std::string empty = write(dir, "empty.bin", {});
  expect_error<ValueError>([&] { Pipeline(two_sources(path_a, empty, 1, 1), tok, 2, 16, 1, 0, 1, kVocab); },
                           {"'b'", "empty.bin", "empty"});
  const std::string foreign = write(dir, "foreign.bin", a.tokens, "gpt2:/x/tokenizer");
  expect_error<ConfigError>([&] { Pipeline(two_sources(path_a, foreign, 1, 1), tok, 2, 16, 1, 0, 1, kVocab); },
                            {"'b'", "foreign.bin", "gpt2:/x/tokenizer", "byte"});
  const std::string shard_dir = (dir / "mixed").string();
  write(dir, "mixed/00.bin", a.tokens);
  write(dir, "mixed/01.bin", a.tokens, "other");
  expect_error<ConfigError>([&] { Pipeline(two_sources(path_a, shard_dir, 1, 1), tok, 2, 16, 1, 0, 1, kVocab); },
                            {"'b'", "01.bin", "'other'"});
  const std::string short_file = write(dir, "short.bin", {1, 2, 3});
  expect_error<ValueError>([&] { Pipeline(two_sources(short_file, path_b, 1, 1), tok, 2, 16, 1, 0, 1, kVocab); },
                           {"'a'", "3 tokens", "too few"});
  expect_error<IOError>(
      [&] { Pipeline(two_sources(path_a, (dir / "nope").string(), 1, 1), tok, 2, 16, 1, 0, 1, kVocab); },
      {"'b'", "does not exist"});
  expect_error<ValueError>([&] { Pipeline(two_sources(path_a, path_b, 1, 1), tok, 2, 16, 1, 0, 1, /*vocab=*/500); },
                           {"'a'", "a.bin"});
  std::filesystem::create_directories(dir / "nothing");
  PipelineSpec spec = two_sources(path_a, (dir / "nothing").string(), 1, 1);
  spec.sources[1].kind = "tokens";
  expect_error<ValueError>([&] { Pipeline(spec, tok, 2, 16, 1, 0, 1, kVocab); }, {"'b'", "no token files"});
  expect_error<ConfigError>(
      [&] {
        PipelineSpec same = two_sources(path_a, path_b, 1, 1);
        same.sources[1].name = "a";
        Pipeline(same, tok, 2, 16, 1, 0, 1, kVocab);
      },
      {"two sources are named 'a'"});
}

}  // namespace
}  // namespace tessera::data
