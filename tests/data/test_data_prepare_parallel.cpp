// prepare_dataset on several threads and with document separators: the output files
// are bitwise the same for every thread count (byte tokenizer and SentencePiece), the
// token stream is each document's own encoding followed by its separator, and the
// validation split still starts at a document.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/base/thread_pool.h"
#include "tessera/data/prepare.h"
#include "tessera/data/token_file.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using tessera::testing::read_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;

const std::string kSpm =
    "spm:" + (fs::path(TESSERA_SOURCE_DIR) / "tests/data/fixtures/tokenizers/spm/tokenizer.model").string();

std::vector<int32_t> read_tokens(const fs::path& path) {
  TokenFile file(path);
  std::vector<int32_t> ids(file.size());
  file.read(0, ids.size(), ids.data());
  return ids;
}

// Documents of different sizes and scripts (file names sort as doc00, doc01, ...).
std::vector<std::string> make_documents(int count) {
  const std::vector<std::string> lines = {"The quick brown fox jumps over the lazy dog.\n",
                                          "Numbers 12345 and 3.14159\n",
                                          "  indented\twith tabs\n",
                                          "Grüße, café, naïve — ünïcödé\n",
                                          "日本語のテキスト 😀\n",
                                          "no final newline here"};
  std::vector<std::string> docs;
  for (int d = 0; d < count; ++d) {
    std::string doc;
    for (int i = 0; i < 3 + (d * 7) % 40; ++i) doc += lines[static_cast<size_t>(i + d) % (lines.size() - 1)];
    if (d % 3 == 0) doc += lines.back();  // some documents end without a newline
    docs.push_back(doc);
  }
  return docs;
}

fs::path write_documents(const TempDir& dir, const std::vector<std::string>& docs) {
  for (size_t d = 0; d < docs.size(); ++d) write_bytes(dir / fmt::format("in/doc{:02}.txt", d), docs[d]);
  return dir / "in";
}

PrepareResult prepare(const fs::path& in, const fs::path& out, const std::string& tokenizer, int threads,
                      const std::string& separator = "auto", double val_fraction = 0.1) {
  PrepareOptions options;
  options.progress = false;
  options.tokenizer = tokenizer;
  options.threads = threads;
  options.separator = separator;
  options.val_fraction = val_fraction;
  return prepare_dataset({in}, out, options);
}

// Sets the process's thread pool size for one scope (prepare runs on the pool).
struct PoolSize {
  explicit PoolSize(int n) : saved(num_threads()) { set_num_threads(n); }
  ~PoolSize() { set_num_threads(saved); }
  int saved;
};

void expect_same_output_for_thread_counts(const std::string& tokenizer, int documents) {
  const PoolSize pool(8);  // 8 lanes really run at once, whatever the machine has
  TempDir dir;
  const fs::path in = write_documents(dir, make_documents(documents));
  const PrepareResult one = prepare(in, dir / "t1", tokenizer, 1);
  EXPECT_EQ(one.threads, 1);
  for (int threads : {2, 3, 8}) {
    const fs::path out = dir / fmt::format("t{}", threads);
    const PrepareResult many = prepare(in, out, tokenizer, threads);
    EXPECT_EQ(many.threads, threads);
    const PoolSize smaller(2);  // lanes beyond the pool's size are not claimed
    EXPECT_EQ(prepare(in, out / "capped", tokenizer, threads).threads, 2);
    EXPECT_EQ(many.train_tokens, one.train_tokens) << threads;
    EXPECT_EQ(many.files, one.files) << threads;
    for (const char* file : {"train.bin", "val.bin", "meta.json"})
      EXPECT_EQ(read_bytes(out / file), read_bytes(dir / "t1" / file)) << file << " with " << threads << " threads";
  }
}

TEST(PrepareParallel, SameBytesForEveryThreadCountByte) { expect_same_output_for_thread_counts("byte", 23); }

TEST(PrepareParallel, SameBytesForEveryThreadCountSentencePiece) { expect_same_output_for_thread_counts(kSpm, 23); }

TEST(PrepareParallel, BigFileThroughEncodeParallel) {
  // Over the 4 MiB at which a file is encoded alone, among small ones.
  TempDir dir;
  std::string big;
  while (big.size() < (size_t{9} << 19)) big += "a line of the big document, 0123456789\n";
  write_bytes(dir / "in/a.txt", "small before\n");
  write_bytes(dir / "in/b.txt", big);
  write_bytes(dir / "in/c.txt", "small after");
  const PrepareResult one = prepare(dir / "in", dir / "t1", "byte", 1);
  const PrepareResult four = prepare(dir / "in", dir / "t4", "byte", 4);
  EXPECT_EQ(one.bytes_read, 13 + big.size() + 12);
  EXPECT_EQ(read_bytes(dir / "t4/train.bin"), read_bytes(dir / "t1/train.bin"));
  EXPECT_EQ(read_bytes(dir / "t4/val.bin"), read_bytes(dir / "t1/val.bin"));
  EXPECT_GT(four.seconds, 0.0);
  EXPECT_GT(four.megabytes_per_second, 0.0);
}

// The stream train.bin + val.bin, and what each separator makes of the documents.
TEST(PrepareParallel, SeparatorsJoinDocuments) {
  TempDir dir;
  const std::vector<std::string> docs = make_documents(6);
  const fs::path in = write_documents(dir, docs);
  const auto spm = make_tokenizer(kSpm);
  ASSERT_TRUE(spm->eos_id().has_value());
  const int32_t eos = *spm->eos_id();

  auto stream = [&](const fs::path& out) {
    std::vector<int32_t> ids = read_tokens(out / "train.bin"), val = read_tokens(out / "val.bin");
    ids.insert(ids.end(), val.begin(), val.end());
    return ids;
  };
  std::vector<int32_t> want_eos, want_newline, want_none;
  for (const std::string& doc : docs) {
    const std::vector<int32_t> ids = spm->encode(doc);
    want_eos.insert(want_eos.end(), ids.begin(), ids.end());
    want_eos.push_back(eos);
    want_none.insert(want_none.end(), ids.begin(), ids.end());
    const std::vector<int32_t> line = spm->encode(doc.ends_with('\n') ? doc : doc + "\n");
    want_newline.insert(want_newline.end(), line.begin(), line.end());
  }

  // auto: SentencePiece has </s>.
  const PrepareResult automatic = prepare(in, dir / "auto", kSpm, 2);
  EXPECT_EQ(automatic.separator, "eos");
  EXPECT_EQ(stream(dir / "auto"), want_eos);
  nlohmann::json meta = nlohmann::json::parse(read_bytes(dir / "auto/meta.json"));
  EXPECT_EQ(meta["separator"], "eos");
  EXPECT_EQ(meta["eos_id"], eos);
  EXPECT_EQ(meta["tokenizer"], spm->id());
  EXPECT_EQ(meta["tokenizer_spec"], spm->spec());

  EXPECT_EQ(prepare(in, dir / "newline", kSpm, 2, "newline").separator, "newline");
  EXPECT_EQ(stream(dir / "newline"), want_newline);
  meta = nlohmann::json::parse(read_bytes(dir / "newline/meta.json"));
  EXPECT_EQ(meta["separator"], "newline");
  EXPECT_FALSE(meta.contains("eos_id"));

  EXPECT_EQ(prepare(in, dir / "none", kSpm, 2, "none").separator, "none");
  EXPECT_EQ(stream(dir / "none"), want_none);

  // auto with the byte tokenizer (no end-of-text token): newline, the bytes themselves.
  const PrepareResult bytes = prepare(in, dir / "byte", "byte", 2);
  EXPECT_EQ(bytes.separator, "newline");
  std::string text;
  for (const std::string& doc : docs) text += doc.ends_with('\n') ? doc : doc + "\n";
  const std::vector<int32_t> ids = stream(dir / "byte");
  EXPECT_EQ(std::string(ids.begin(), ids.end()), text);
  EXPECT_EQ(bytes.bytes_read, text.size());
}

TEST(PrepareParallel, ValidationStartsAfterAnEndOfText) {
  TempDir dir;
  const std::vector<std::string> docs = make_documents(12);
  const fs::path in = write_documents(dir, docs);
  const auto spm = make_tokenizer(kSpm);
  const PrepareResult result = prepare(in, dir / "out", kSpm, 3, "eos", 0.2);
  ASSERT_TRUE(result.split_at_document);
  const std::vector<int32_t> train = read_tokens(dir / "out/train.bin"), val = read_tokens(dir / "out/val.bin");
  ASSERT_FALSE(train.empty());
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(train.back(), *spm->eos_id());
  EXPECT_EQ(val.back(), *spm->eos_id());
  // val is whole documents: the last k of them, each with its </s>.
  std::vector<int32_t> tail;
  size_t k = 0;
  while (tail.size() < val.size() && k < docs.size()) {
    std::vector<int32_t> doc = spm->encode(docs[docs.size() - 1 - k++]);
    doc.push_back(*spm->eos_id());
    tail.insert(tail.begin(), doc.begin(), doc.end());
  }
  EXPECT_EQ(tail, val);
  EXPECT_GE(k, 1u);
}

TEST(PrepareParallel, Errors) {
  TempDir dir;
  write_bytes(dir / "t.txt", "hello\n");
  PrepareOptions options;
  options.progress = false;
  options.separator = "eos";  // the byte tokenizer has none
  try {
    prepare_dataset({dir / "t.txt"}, dir / "out", options);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no end-of-text token"), std::string::npos) << e.what();
  }
  options.separator = "endoftext";
  try {
    prepare_dataset({dir / "t.txt"}, dir / "out", options);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown separator 'endoftext'"), std::string::npos) << e.what();
  }
  options.separator = "auto";
  options.threads = -1;
  EXPECT_THROW(prepare_dataset({dir / "t.txt"}, dir / "out", options), ValueError);
  EXPECT_FALSE(fs::exists(dir / "out"));
}

}  // namespace
}  // namespace tessera::data
