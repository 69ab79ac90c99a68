// Token shard files: a 64-byte header then the token ids, little-endian.
//
//   offset  size  field
//   0       8     magic "TSRTOKS\0"
//   8       4     version (1)
//   12      4     bytes per token (2: uint16, 4: uint32)
//   16      8     token count
//   24      32    tokenizer id, NUL-padded
//   56      8     XXH3-64 of the body (the token bytes)
//   64      ...   count * bytes-per-token bytes
//
// uint16 is used whenever the vocabulary fits (<= 65536), else uint32.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tessera::data {

struct TokenFileHeader {
  uint32_t version = 1;
  uint32_t bytes_per_token = 2;
  uint64_t count = 0;
  std::string tokenizer;
  uint64_t body_hash = 0;
};

// Writes atomically (temporary name, fsync, rename). Ids must be < 2^(8*bytes) (the
// width is chosen from vocab_size).
void write_token_file(const std::filesystem::path& path, const std::vector<int32_t>& tokens,
                      const std::string& tokenizer_id, int64_t vocab_size);

// A token file read into memory and checked: wrong magic, unknown version or width,
// a body shorter or longer than the header says, or a body hash mismatch are
// IOErrors naming the file and what was expected.
class TokenFile {
 public:
  explicit TokenFile(const std::filesystem::path& path);
  const TokenFileHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return header_.count; }
  // Token at `index` (< size()).
  int32_t operator[](uint64_t index) const;
  // Copies tokens [start, start + n) as int32 into out.
  void read(uint64_t start, uint64_t n, int32_t* out) const;
  // A ValueError naming the file, the first offending position and id unless every id is
  // in [0, vocab): the hash proves the file is what was written, not that it fits this
  // model (an id past the embedding table would read another row, or wrap).
  void check_vocabulary(int64_t vocab) const;

 private:
  std::filesystem::path path_;
  TokenFileHeader header_;
  std::vector<uint8_t> body_;
};

TokenFileHeader read_token_file_header(const std::filesystem::path& path);

}  // namespace tessera::data
