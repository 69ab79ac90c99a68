// The GEMM algorithm cache and its text form (see gemm_algo_cache.h).
#include "backend/cuda/kernels/gemm_algo_cache.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/base/error.h"

namespace tessera::cuda {

namespace {

constexpr std::string_view kHeader = "tessera-gemm-algo-cache 1";

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) words.push_back(line.substr(i, j - i));
    i = j;
  }
  return words;
}

template <typename V>
bool parse_int(std::string_view word, V& out, int base = 10) {
  const char* end = word.data() + word.size();
  auto [ptr, ec] = std::from_chars(word.data(), end, out, base);
  return ec == std::errc() && ptr == end;
}

}  // namespace

std::string GemmKey::text() const {
  return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", m, n, k, batch, a_batch_stride,
                     b_batch_stride, trans_a ? 1 : 0, trans_b ? 1 : 0, dtype, compute, epilogue, align_a, align_b,
                     align_c, align_bias, align_aux, sm, library);
}

std::optional<GemmChoice> GemmAlgoCache::find(const GemmKey& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void GemmAlgoCache::insert(const GemmKey& key, const GemmChoice& choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[key] = choice;
}

void GemmAlgoCache::erase(const GemmKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.erase(key);
}

size_t GemmAlgoCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

void GemmAlgoCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

std::string GemmAlgoCache::serialize() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out(kHeader);
  out += '\n';
  for (const auto& [key, choice] : entries_) {
    out += key.text();
    out += " :";
    for (uint64_t word : choice.algo) out += fmt::format(" {:016x}", word);
    out += fmt::format(" {} {}\n", choice.workspace_bytes, choice.time_us);
  }
  return out;
}

size_t GemmAlgoCache::deserialize(std::string_view text) {
  std::map<GemmKey, GemmChoice> read;
  size_t line_no = 0;
  bool header = false;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    const std::vector<std::string_view> w = split_words(line);
    if (w.empty()) continue;
    if (!header) {
      if (w.size() != 2 || w[0] != "tessera-gemm-algo-cache" || w[1] != "1")
        fail<ValueError>("gemm algo cache: line {} is not the header (got '{}'; expected '{}')", line_no, line,
                         kHeader);
      header = true;
      continue;
    }
    // 18 key fields, ':', 8 algo words, workspace, time.
    constexpr size_t kKeyFields = 18;
    bool ok = w.size() == kKeyFields + 1 + 8 + 2 && w[kKeyFields] == ":";
    GemmKey key;
    GemmChoice choice;
    if (ok) {
      int64_t v[kKeyFields];
      for (size_t i = 0; i < kKeyFields && ok; ++i) ok = parse_int(w[i], v[i]);
      if (ok) {
        key.m = v[0];
        key.n = v[1];
        key.k = v[2];
        key.batch = v[3];
        key.a_batch_stride = v[4];
        key.b_batch_stride = v[5];
        ok = (v[6] == 0 || v[6] == 1) && (v[7] == 0 || v[7] == 1);
        key.trans_a = v[6] == 1;
        key.trans_b = v[7] == 1;
        key.dtype = static_cast<int>(v[8]);
        key.compute = static_cast<int>(v[9]);
        key.epilogue = static_cast<int>(v[10]);
        key.align_a = static_cast<int>(v[11]);
        key.align_b = static_cast<int>(v[12]);
        key.align_c = static_cast<int>(v[13]);
        key.align_bias = static_cast<int>(v[14]);
        key.align_aux = static_cast<int>(v[15]);
        key.sm = static_cast<int>(v[16]);
        key.library = v[17];
      }
      for (size_t i = 0; i < 8 && ok; ++i) ok = parse_int(w[kKeyFields + 1 + i], choice.algo[i], 16);
      if (ok) ok = parse_int(w[kKeyFields + 9], choice.workspace_bytes);
      if (ok) {
        const std::string t(w[kKeyFields + 10]);
        char* end = nullptr;
        choice.time_us = std::strtof(t.c_str(), &end);
        ok = end == t.c_str() + t.size();
      }
    }
    if (!ok)
      fail<ValueError>(
          "gemm algo cache: malformed entry at line {} (got '{}'; expected 18 integers, ':', 8 hex words, the "
          "workspace bytes and the time)",
          line_no, line);
    choice.verified = false;
    read[key] = choice;
  }
  if (!header && !read.empty()) fail<ValueError>("gemm algo cache: missing header '{}'", kHeader);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, choice] : read) entries_[key] = choice;
  return read.size();
}

GemmAlgoCache& gemm_algo_cache() {
  static GemmAlgoCache cache;
  return cache;
}

}  // namespace tessera::cuda
