#include "tessera/ir/attributes.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>

#include "tessera/base/error.h"

namespace tessera {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Attribute text may span lines in hand-written IR.
std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Splits at commas outside brackets, braces and parentheses; throws on unbalanced text.
std::vector<std::string_view> split_top_level(std::string_view text, const std::string& op) {
  std::vector<std::string_view> parts;
  std::string closers;  // expected closing characters, innermost last
  size_t begin = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '[' || c == '{' || c == '(') {
      closers.push_back(c == '[' ? ']' : c == '{' ? '}' : ')');
    } else if (c == ']' || c == '}' || c == ')') {
      if (closers.empty() || closers.back() != c) {
        fail<ValueError>("{}: unbalanced '{}' at column {} of attributes '{}'", op, c, i + 1, text);
      }
      closers.pop_back();
    } else if (c == ',' && closers.empty()) {
      parts.push_back(trim(text.substr(begin, i - begin)));
      begin = i + 1;
    }
  }
  if (!closers.empty()) fail<ValueError>("{}: missing '{}' in attributes '{}'", op, closers.back(), text);
  parts.push_back(trim(text.substr(begin)));
  return parts;
}

bool parse_int64(std::string_view s, int64_t& out) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

AttributeMap::AttributeMap(std::string op, const std::string& text) : op_(std::move(op)), text_(text) {
  if (trim(text).empty()) return;
  for (std::string_view part : split_top_level(text, op_)) {
    size_t eq = part.find('=');
    if (eq == std::string_view::npos || trim(part.substr(0, eq)).empty()) {
      fail<ValueError>("{}: attribute '{}' is not key=value (in '{}')", op_, part, text_);
    }
    std::string key(trim(part.substr(0, eq)));
    if (!values_.emplace(key, std::string(trim(part.substr(eq + 1)))).second) {
      fail<ValueError>("{}: attribute '{}' given twice (in '{}')", op_, key, text_);
    }
  }
}

const std::string& AttributeMap::raw(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) fail<ValueError>("{}: missing attribute '{}' (in '{}')", op_, key, text_);
  read_.insert(key);
  return it->second;
}

int64_t AttributeMap::get_int(const std::string& key) const {
  const std::string& v = raw(key);
  int64_t out = 0;
  if (!parse_int64(v, out)) fail<ValueError>("{}: attribute '{}' = '{}' is not an integer", op_, key, v);
  return out;
}

double AttributeMap::get_double(const std::string& key) const {
  const std::string& v = raw(key);
  // strtod reads fmt's shortest round-trip spelling (and inf / nan) back exactly.
  const char* begin = v.c_str();
  char* end = nullptr;
  errno = 0;
  double out = std::strtod(begin, &end);
  bool overflow = errno == ERANGE &&
                  (out == std::numeric_limits<double>::infinity() || out == -std::numeric_limits<double>::infinity());
  if (v.empty() || end != begin + v.size() || overflow) {
    fail<ValueError>("{}: attribute '{}' = '{}' is not a number", op_, key, v);
  }
  return out;
}

bool AttributeMap::get_bool(const std::string& key) const {
  const std::string& v = raw(key);
  if (v == "true") return true;
  if (v == "false") return false;
  fail<ValueError>("{}: attribute '{}' = '{}' is not a bool (expected true or false)", op_, key, v);
}

DType AttributeMap::get_dtype(const std::string& key) const {
  const std::string& v = raw(key);
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dtype = static_cast<DType>(i);
    if (v == name(dtype)) return dtype;
  }
  fail<ValueError>("{}: attribute '{}' = '{}' is not a dtype (expected e.g. float32)", op_, key, v);
}

std::vector<int64_t> AttributeMap::get_ints(const std::string& key) const {
  const std::string& v = raw(key);
  std::string_view s = v;
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') {
    fail<ValueError>("{}: attribute '{}' = '{}' is not a list (expected [1, 2, ...])", op_, key, v);
  }
  std::vector<int64_t> out;
  std::string_view inner = trim(s.substr(1, s.size() - 2));
  if (inner.empty()) return out;
  size_t begin = 0;
  while (true) {
    size_t comma = inner.find(',', begin);
    std::string_view item =
        inner.substr(begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    int64_t x = 0;
    if (!parse_int64(item, x)) {
      fail<ValueError>("{}: attribute '{}' = '{}' has a non-integer element '{}'", op_, key, v, trim(item));
    }
    out.push_back(x);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return out;
}

void AttributeMap::check_all_read() const {
  for (const auto& [key, value] : values_) {
    if (!read_.count(key)) fail<ValueError>("{}: unknown attribute '{}={}' (in '{}')", op_, key, value, text_);
  }
}

}  // namespace tessera
