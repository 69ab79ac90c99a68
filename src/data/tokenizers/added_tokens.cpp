#include "added_tokens.h"

#include <algorithm>

#include "char_class.h"

namespace tessera::data::bpe {

namespace {

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The start of the whitespace run that ends at `end`, not before `floor`.
size_t space_run_start(std::string_view text, size_t end, size_t floor) {
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && end - start < 4 && is_continuation(text[start])) --start;
    const Utf8Char c = char_at(text.data(), text.size(), start);
    if (c.cls != CharClass::kSpace || start + c.length != end) break;
    end = start;
  }
  return end;
}

size_t space_run_end(std::string_view text, size_t start) {
  while (start < text.size()) {
    const Utf8Char c = char_at(text.data(), text.size(), start);
    if (c.cls != CharClass::kSpace) break;
    start += c.length;
  }
  return start;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    int32_t node = 0;
    for (const char ch : content) {
      const auto byte = static_cast<unsigned char>(ch);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        auto& children = nodes_[static_cast<size_t>(node)].children;
        children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
                        {byte, next});
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[static_cast<size_t>(node)].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[static_cast<size_t>(node)].children;
  const auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

void AddedTokenMatcher::find_all(std::string_view text, std::vector<AddedMatch>& out) const {
  if (empty()) return;
  size_t floor = 0;  // the end of the previous match: lstrip stops there
  for (size_t i = 0; i < text.size();) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (const int32_t t = nodes_[static_cast<size_t>(node)].token; t >= 0) best = t, best_end = j + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(best)];
    AddedMatch match{i, best_end, token.id};
    if (token.lstrip) match.start = space_run_start(text, i, floor);
    if (token.rstrip) match.end = space_run_end(text, best_end);
    out.push_back(match);
    floor = i = match.end;
  }
}

}  // namespace tessera::data::bpe
