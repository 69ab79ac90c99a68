#include "tessera/data/token_file.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "tessera/base/error.h"
#include "tessera/base/file_io.h"

namespace tessera::data {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'T', 'O', 'K', 'S', '\0'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kTokenizerIdBytes = 32;
constexpr uint32_t kVersion = 1;
// Tokens converted (or hashed) per chunk: bounded memory for any file size.
constexpr size_t kChunkTokens = size_t{1} << 20;

// Fixed little-endian encoding, independent of the host's byte order.
void put_le(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t get_le(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

using StatePtr = std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>;
StatePtr new_state(const std::filesystem::path& path) {
  StatePtr state(XXH3_createState(), XXH3_freeState);
  if (!state) fail<IOError>("token file {}: out of memory for the XXH3 state", path.string());
  XXH3_64bits_reset(state.get());
  return state;
}

TokenFileHeader parse_header(const std::filesystem::path& path, const uint8_t* bytes, uint64_t file_size) {
  if (file_size < kHeaderBytes)
    fail<IOError>("token file {}: truncated header ({} bytes; expected at least {})", path.string(), file_size,
                  kHeaderBytes);
  if (std::memcmp(bytes, kMagic, sizeof(kMagic)) != 0)
    fail<IOError>("token file {}: wrong magic (expected \"TSRTOKS\\0\", found bytes {:02x}): not a tessera token file",
                  path.string(), fmt::join(bytes, bytes + sizeof(kMagic), " "));
  TokenFileHeader header;
  header.version = static_cast<uint32_t>(get_le(bytes + 8, 4));
  header.bytes_per_token = static_cast<uint32_t>(get_le(bytes + 12, 4));
  header.count = get_le(bytes + 16, 8);
  const char* id = reinterpret_cast<const char*>(bytes + 24);
  header.tokenizer.assign(id, strnlen(id, kTokenizerIdBytes));
  header.body_hash = get_le(bytes + 56, 8);
  if (header.version != kVersion)
    fail<IOError>("token file {}: unsupported version {} (expected {})", path.string(), header.version, kVersion);
  if (header.bytes_per_token != 2 && header.bytes_per_token != 4)
    fail<IOError>("token file {}: unsupported token width {} bytes (expected 2 or 4)", path.string(),
                  header.bytes_per_token);
  const uint64_t body = file_size - kHeaderBytes;
  if (header.count > body / header.bytes_per_token || body != header.count * header.bytes_per_token) {
    const bool short_body = header.count > body / header.bytes_per_token;
    fail<IOError>("token file {}: {} body ({} bytes; the header says {} tokens x {} bytes = {} bytes)", path.string(),
                  short_body ? "truncated" : "overlong", body, header.count, header.bytes_per_token,
                  header.count > UINT64_MAX / header.bytes_per_token
                      ? std::string("more than 2^64")
                      : std::to_string(header.count * header.bytes_per_token));
  }
  return header;
}

}  // namespace

void write_token_file(const std::filesystem::path& path, const std::vector<int32_t>& tokens,
                      const std::string& tokenizer_id, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 31))
    fail<ValueError>("write_token_file {}: vocab_size {} out of range (1 .. 2^31)", path.string(), vocab_size);
  if (tokenizer_id.empty() || tokenizer_id.size() > kTokenizerIdBytes || tokenizer_id.find('\0') != std::string::npos)
    fail<ValueError>("write_token_file {}: tokenizer id '{}' must be 1 to {} bytes without NUL", path.string(),
                     tokenizer_id, kTokenizerIdBytes);
  const int width = vocab_size <= 65536 ? 2 : 4;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      fail<ValueError>("write_token_file {}: token {} at position {} is outside the vocabulary [0, {})", path.string(),
                       tokens[i], i, vocab_size);

  fileio::write_file_atomic(path, [&](fileio::File& file) {
    std::array<uint8_t, kHeaderBytes> header{};
    file.write_all(header.data(), header.size());  // placeholder until the body hash is known
    StatePtr state = new_state(path);
    std::vector<uint8_t> chunk(std::min(tokens.size(), kChunkTokens) * width);
    for (size_t start = 0; start < tokens.size(); start += kChunkTokens) {
      const size_t n = std::min(kChunkTokens, tokens.size() - start);
      for (size_t i = 0; i < n; ++i) put_le(chunk.data() + i * width, static_cast<uint32_t>(tokens[start + i]), width);
      XXH3_64bits_update(state.get(), chunk.data(), n * width);
      file.write_all(chunk.data(), n * width);
    }
    std::memcpy(header.data(), kMagic, sizeof(kMagic));
    put_le(header.data() + 8, kVersion, 4);
    put_le(header.data() + 12, static_cast<uint64_t>(width), 4);
    put_le(header.data() + 16, tokens.size(), 8);
    std::memcpy(header.data() + 24, tokenizer_id.data(), tokenizer_id.size());
    put_le(header.data() + 56, XXH3_64bits_digest(state.get()), 8);
    file.write_at(0, header.data(), header.size());
  });
}

TokenFileHeader read_token_file_header(const std::filesystem::path& path) {
  fileio::File file(path, O_RDONLY);
  std::array<uint8_t, kHeaderBytes> bytes{};
  file.read_at(0, bytes.data(), bytes.size());
  return parse_header(path, bytes.data(), file.size());
}

TokenFile::TokenFile(const std::filesystem::path& path) : path_(path) {
  fileio::File file(path, O_RDONLY);
  const uint64_t file_size = file.size();
  std::array<uint8_t, kHeaderBytes> bytes{};
  file.read_at(0, bytes.data(), bytes.size());
  header_ = parse_header(path, bytes.data(), file_size);

  const uint64_t body_bytes = file_size - kHeaderBytes;
  body_.resize(body_bytes);
  StatePtr state = new_state(path);
  const size_t chunk = kChunkTokens * 4;
  for (uint64_t offset = 0; offset < body_bytes; offset += chunk) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, body_bytes - offset));
    const size_t got = file.read_at(kHeaderBytes + offset, body_.data() + offset, want);
    if (got != want)
      fail<IOError>("token file {}: the file shrank while being read ({} of {} body bytes)", path.string(),
                    offset + got, body_bytes);
    XXH3_64bits_update(state.get(), body_.data() + offset, want);
  }
  const uint64_t hash = XXH3_64bits_digest(state.get());
  if (hash != header_.body_hash)
    fail<IOError>("token file {}: body hash mismatch (expected xxh3 {}, found {}): the file is corrupt", path.string(),
                  fileio::hex64(header_.body_hash), fileio::hex64(hash));
}

int32_t TokenFile::operator[](uint64_t index) const {
  if (index >= header_.count)
    fail<ValueError>("token file {}: index {} out of range ({} tokens)", path_.string(), index, header_.count);
  return static_cast<int32_t>(get_le(body_.data() + index * header_.bytes_per_token, header_.bytes_per_token));
}

void TokenFile::check_vocabulary(int64_t vocab) const {
  const uint32_t width = header_.bytes_per_token;
  for (uint64_t i = 0; i < header_.count; ++i) {
    const uint64_t id = get_le(body_.data() + i * width, static_cast<int>(width));
    if (vocab <= 0 || id >= static_cast<uint64_t>(vocab))
      fail<ValueError>("token file {}: token {} at position {} is outside the model's vocabulary [0, {})",
                       path_.string(), id, i, vocab);
  }
}

void TokenFile::read(uint64_t start, uint64_t n, int32_t* out) const {
  if (start > header_.count || n > header_.count - start)
    fail<ValueError>("token file {}: tokens [{}, {}) out of range ({} tokens)", path_.string(), start, start + n,
                     header_.count);
  const uint8_t* p = body_.data() + start * header_.bytes_per_token;
  if (header_.bytes_per_token == 2) {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[2 * i] | (p[2 * i + 1] << 8));
  } else {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(get_le(p + 4 * i, 4));
  }
}

}  // namespace tessera::data
