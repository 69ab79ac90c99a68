// prepare_dataset on a small tree of text files: which files are taken, the token
// stream (train.bin followed by val.bin is every document in path order), the split at
// a document boundary, meta.json, determinism and the errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/prepare.h"
#include "tessera/data/token_file.h"

namespace tessera::data {
namespace {

using tessera::testing::read_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;

std::string decode_file(const std::filesystem::path& path) {
  TokenFile file(path);
  std::vector<int32_t> ids(file.size());
  file.read(0, ids.size(), ids.data());
  std::string text;
  for (int32_t id : ids) text.push_back(static_cast<char>(id));
  return text;
}

std::string repeat(const std::string& line, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += line;
  return out;
}

struct Corpus {
  TempDir dir;
  std::string a = repeat("alpha line of text\n", 40), b = repeat("beta: more text here\n", 40),
              c = "gamma without a final newline", d = repeat("delta\n", 10);
  Corpus() {
    write_bytes(dir / "in/b.txt", b);
    write_bytes(dir / "in/a.txt", a);
    write_bytes(dir / "in/sub/c", c);
    write_bytes(dir / "in/sub/d.md", d);
    write_bytes(dir / "in/index.dat", std::string("\x00\x00\x00\x02header", 10) + "text after");
    write_bytes(dir / "in/empty.txt", "");
    write_bytes(dir / "in/.git/config", "[core]\n");
    write_bytes(dir / "in/.hidden", "secret\n");
    std::filesystem::create_symlink("a.txt", dir / "in/a.u8");
  }
};

TEST(PrepareDataset, TakesTextFilesOnceInPathOrder) {
  Corpus corpus;
  PrepareOptions options;
  options.progress = false;
  options.val_fraction = 0.1;
  const PrepareResult result = prepare_dataset({corpus.dir / "in"}, corpus.dir / "out", options);

  const auto in = corpus.dir / "in";
  EXPECT_EQ(result.files,
            (std::vector<std::filesystem::path>{in / "a.txt", in / "b.txt", in / "sub/c", in / "sub/d.md"}));
  // Sorted: a.u8 (duplicate), empty.txt, index.dat (binary).
  ASSERT_EQ(result.skipped.size(), 3u);
  EXPECT_EQ(result.skipped[0].path, in / "a.u8");
  EXPECT_NE(result.skipped[0].reason.find("same file as"), std::string::npos);
  EXPECT_EQ(result.skipped[1].reason, "empty");
  EXPECT_EQ(result.skipped[2].path, in / "index.dat");
  EXPECT_NE(result.skipped[2].reason.find("binary"), std::string::npos);

  const std::string stream = corpus.a + corpus.b + corpus.c + "\n" + corpus.d;
  EXPECT_EQ(result.bytes_read, stream.size());
  EXPECT_EQ(result.train_tokens + result.val_tokens, stream.size());
  const std::string train = decode_file(corpus.dir / "out/train.bin");
  const std::string val = decode_file(corpus.dir / "out/val.bin");
  EXPECT_EQ(train + val, stream);
  // 10% of 1690 tokens is 169; the last documents, "c\n" + d, are 30 + 60 = 90 tokens:
  // within a factor 2, so val starts at the document c.
  EXPECT_TRUE(result.split_at_document);
  EXPECT_EQ(val, corpus.c + "\n" + corpus.d);

  const nlohmann::json meta = nlohmann::json::parse(read_bytes(corpus.dir / "out/meta.json"));
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["train"]["tokens"], result.train_tokens);
  EXPECT_EQ(meta["val"]["tokens"], result.val_tokens);
  EXPECT_EQ(meta["files"].size(), 4u);
  EXPECT_EQ(meta["skipped"].size(), 3u);

  // Same inputs, same bytes.
  const std::string first = read_bytes(corpus.dir / "out/train.bin");
  prepare_dataset({corpus.dir / "in"}, corpus.dir / "out2", options);
  EXPECT_EQ(read_bytes(corpus.dir / "out2/train.bin"), first);
  EXPECT_EQ(read_bytes(corpus.dir / "out2/meta.json"), read_bytes(corpus.dir / "out/meta.json"));
}

TEST(PrepareDataset, SplitsInsideADocumentAtALineStart) {
  TempDir dir;
  const std::string text = repeat("0123456789abcdefghi\n", 100);  // one document of 2000 bytes
  write_bytes(dir / "one.txt", text);
  PrepareOptions options;
  options.progress = false;
  options.val_fraction = 0.0525;  // 105 tokens: the next line start after 1895 is 1900
  const PrepareResult result = prepare_dataset({dir / "one.txt"}, dir / "out", options);
  EXPECT_FALSE(result.split_at_document);
  EXPECT_EQ(result.train_tokens, 1900u);
  EXPECT_EQ(result.val_tokens, 100u);

  options.val_fraction = 0;
  const PrepareResult all_train = prepare_dataset({dir / "one.txt"}, dir / "out0", options);
  EXPECT_EQ(all_train.train_tokens, 2000u);
  EXPECT_EQ(all_train.val_tokens, 0u);
  EXPECT_EQ(TokenFile(dir / "out0/val.bin").size(), 0u);
}

TEST(PrepareDataset, ExcludeGlobs) {
  Corpus corpus;
  PrepareOptions options;
  options.progress = false;
  options.exclude = {"*.md", "*/sub/c"};
  const PrepareResult result = prepare_dataset({corpus.dir / "in"}, corpus.dir / "out", options);
  EXPECT_EQ(result.files.size(), 2u);
  EXPECT_EQ(result.train_tokens + result.val_tokens, corpus.a.size() + corpus.b.size());
}

TEST(PrepareDataset, Errors) {
  TempDir dir;
  PrepareOptions options;
  options.progress = false;
  EXPECT_THROW(prepare_dataset({}, dir / "out", options), ValueError);
  EXPECT_THROW(prepare_dataset({dir / "nope"}, dir / "out", options), IOError);
  write_bytes(dir / "bin/x", std::string("\0\1\2", 3));
  EXPECT_THROW(prepare_dataset({dir / "bin"}, dir / "out", options), ValueError);  // no text
  write_bytes(dir / "t.txt", "hello\n");
  options.val_fraction = 1.0;
  EXPECT_THROW(prepare_dataset({dir / "t.txt"}, dir / "out", options), ValueError);
  options.val_fraction = 0.1;
  options.tokenizer = "nope:x";  // an unknown kind
  EXPECT_THROW(prepare_dataset({dir / "t.txt"}, dir / "out", options), ValueError);
  options.tokenizer = "nope";  // a bare spec is a path: missing
  EXPECT_THROW(prepare_dataset({dir / "t.txt"}, dir / "out", options), IOError);
  options.tokenizer = "byte";
  write_bytes(dir / "file", "x");
  EXPECT_THROW(prepare_dataset({dir / "t.txt"}, dir / "file/out", options), IOError);  // output under a file
}

}  // namespace
}  // namespace tessera::data
