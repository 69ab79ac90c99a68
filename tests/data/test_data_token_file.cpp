// Token files: the on-disk layout of token_file.h byte by byte, round trips at both
// widths, and every kind of damage reported as an IOError naming the file.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <string>

#include "data/temp_dir.h"
#include "tessera/base/error.h"
#include "tessera/data/token_file.h"

namespace tessera::data {
namespace {

using tessera::testing::flip_bit;
using tessera::testing::read_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;

uint64_t le(const std::string& bytes, size_t offset, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return v;
}

std::vector<int32_t> pattern(size_t n, int32_t vocab) {
  std::vector<int32_t> tokens(n);
  uint64_t x = 12345;
  for (auto& t : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  tokens.back() = vocab - 1;  // the largest id survives the width
  return tokens;
}

// Expects an IOError whose message names the file and contains `what`.
void expect_io_error(const std::filesystem::path& path, const std::string& what) {
  try {
    TokenFile file(path);
    FAIL() << "expected IOError for " << path;
  } catch (const IOError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(TokenFile, Uint16LayoutAndRoundTrip) {
  TempDir dir;
  const auto path = dir / "train.bin";
  const std::vector<int32_t> tokens = pattern(1000, 256);
  write_token_file(path, tokens, "byte", 256);

  // The layout documented in token_file.h, checked independently of the reader.
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 64 + 2 * tokens.size());
  EXPECT_EQ(std::memcmp(bytes.data(), "TSRTOKS\0", 8), 0);
  EXPECT_EQ(le(bytes, 8, 4), 1u);
  EXPECT_EQ(le(bytes, 12, 4), 2u);
  EXPECT_EQ(le(bytes, 16, 8), tokens.size());
  EXPECT_EQ(std::string(bytes.data() + 24, 4), "byte");
  for (size_t i = 28; i < 56; ++i) EXPECT_EQ(bytes[i], '\0') << i;
  EXPECT_EQ(le(bytes, 56, 8), XXH3_64bits(bytes.data() + 64, bytes.size() - 64));
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(le(bytes, 64 + 2 * i, 2), static_cast<uint64_t>(tokens[i]));

  TokenFile file(path);
  EXPECT_EQ(file.size(), tokens.size());
  EXPECT_EQ(file.header().bytes_per_token, 2u);
  EXPECT_EQ(file.header().tokenizer, "byte");
  std::vector<int32_t> back(tokens.size());
  file.read(0, tokens.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(file[999], 255);
  EXPECT_EQ(read_token_file_header(path).count, tokens.size());
  // No temporary file is left next to it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(TokenFile, Uint32RoundTripWhenTheVocabularyIsLarge) {
  TempDir dir;
  const auto path = dir / "big_vocab.bin";
  const std::vector<int32_t> tokens = pattern(777, 100000);
  write_token_file(path, tokens, "bpe-100k", 100000);
  TokenFile file(path);
  EXPECT_EQ(file.header().bytes_per_token, 4u);
  EXPECT_EQ(std::filesystem::file_size(path), 64 + 4 * tokens.size());
  std::vector<int32_t> back(100);
  file.read(600, 100, back.data());
  EXPECT_EQ(back, std::vector<int32_t>(tokens.begin() + 600, tokens.begin() + 700));
  EXPECT_EQ(file[776], 99999);
  EXPECT_THROW(file.read(700, 78, back.data()), ValueError);
}

TEST(TokenFile, EmptyAndOverwrite) {
  TempDir dir;
  const auto path = dir / "t.bin";
  write_token_file(path, {}, "byte", 256);
  EXPECT_EQ(TokenFile(path).size(), 0u);
  write_token_file(path, {1, 2, 3}, "byte", 256);
  EXPECT_EQ(TokenFile(path).size(), 3u);
}

TEST(TokenFile, WriterRejectsIdsOutsideTheVocabulary) {
  TempDir dir;
  EXPECT_THROW(write_token_file(dir / "a.bin", {1, 256}, "byte", 256), ValueError);
  EXPECT_THROW(write_token_file(dir / "a.bin", {-3}, "byte", 256), ValueError);
  EXPECT_THROW(write_token_file(dir / "a.bin", {1}, std::string(33, 'x'), 256), ValueError);
  EXPECT_FALSE(std::filesystem::exists(dir / "a.bin"));
}

// A file whose ids do not fit the model that reads it (made for a larger vocabulary, or
// 4-byte ids at or past 2^31 that would turn negative as int32) is refused by name and
// position before any of it is trained on.
TEST(TokenFile, IdsOutsideTheModelsVocabularyAreRefused) {
  TempDir dir;
  const auto path = dir / "big_vocab.bin";
  write_token_file(path, {1, 2, 70000, 3}, "bpe-100k", 100000);
  const TokenFile file(path);
  EXPECT_NO_THROW(file.check_vocabulary(100000));
  EXPECT_NO_THROW(file.check_vocabulary(70001));
  try {
    file.check_vocabulary(65536);
    ADD_FAILURE() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("token 70000 at position 2"), std::string::npos) << message;
    EXPECT_NE(message.find("[0, 65536)"), std::string::npos) << message;
  }
  EXPECT_THROW(TokenFile(path).check_vocabulary(0), ValueError);
}

TEST(TokenFile, DamageIsAnIOErrorNamingTheFile) {
  TempDir dir;
  const auto good = dir / "good.bin";
  write_token_file(good, pattern(500, 256), "byte", 256);
  const std::string bytes = read_bytes(good);

  const auto magic = dir / "magic.bin";
  write_bytes(magic, "XSRTOKS" + bytes.substr(7));
  expect_io_error(magic, "wrong magic");

  const auto truncated = dir / "truncated.bin";
  write_bytes(truncated, bytes.substr(0, bytes.size() - 3));
  expect_io_error(truncated, "truncated body");

  const auto overlong = dir / "overlong.bin";
  write_bytes(overlong, bytes + "xy");
  expect_io_error(overlong, "overlong body");

  const auto flipped = dir / "flipped.bin";
  write_bytes(flipped, bytes);
  flip_bit(flipped, 64 + 321);
  expect_io_error(flipped, "body hash mismatch");

  const auto version = dir / "version.bin";
  std::string v = bytes;
  v[8] = 2;
  write_bytes(version, v);
  expect_io_error(version, "unsupported version 2");

  const auto width = dir / "width.bin";
  std::string w = bytes;
  w[12] = 3;
  write_bytes(width, w);
  expect_io_error(width, "unsupported token width 3");

  const auto tiny = dir / "tiny.bin";
  write_bytes(tiny, bytes.substr(0, 20));
  expect_io_error(tiny, "truncated header");

  expect_io_error(dir / "missing.bin", "No such file");
}

}  // namespace
}  // namespace tessera::data
