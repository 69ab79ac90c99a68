// A recursive-descent reader for the text Graph::text() prints. It walks the text
// with a cursor (so attribute blocks may span lines) and names the line of every
// error. Value names are looked up, not assumed sequential, so hand-written IR in
// pass tests may number values freely; printing the result renumbers them.
#include "tessera/compiler/parser.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

#include "tessera/base/error.h"
#include "tessera/compiler/primitive_registry.h"

namespace tessera::compiler {
namespace {

constexpr const char* kSpace = " \t\r\n";

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

class Parser {
 public:
  Parser(std::string_view text, const std::vector<Array>& constants) : text_(text), constants_(constants) {}

  Graph parse() {
    expect_word("func");
    expect("@");
    graph_.name = word("a function name");
    parse_parameters();
    expect("->");
    std::vector<TensorType> result_types = parse_result_types();
    expect("{");
    while (true) {
      skip_space();
      if (peek_word("return")) break;
      parse_statement();
    }
    int return_line = line();
    expect_word("return");
    parse_return(result_types, return_line);
    expect("}");
    skip_space();
    if (pos_ != text_.size()) error("expected the end of the text after '}'");
    if (next_constant_ != constants_.size()) {
      fail<ValueError>("parse_graph: {} constant arrays were given but the text reads {}", constants_.size(),
                       next_constant_);
    }
    graph_.verify();
    return std::move(graph_);
  }

  // The whole text is one type ("f32[4, 8]").
  TensorType parse_type() {
    TensorType type = tensor_type();
    skip_space();
    if (pos_ != text_.size()) error("expected the end of the type");
    return type;
  }

 private:
  // ---- lexing ----
  [[noreturn]] void error(const std::string& what) const {
    size_t end = text_.find('\n', pos_);
    std::string_view rest = text_.substr(pos_, end == std::string_view::npos ? std::string_view::npos : end - pos_);
    if (rest.size() > 40) rest = rest.substr(0, 40);
    fail<ValueError>("parse_graph: line {}: {} (got '{}')", line(), what, rest);
  }

  // Counts newlines incrementally from the last query (the cursor mostly moves forward).
  int line() const {
    if (pos_ < line_pos_) line_pos_ = 0, line_ = 1;
    for (; line_pos_ < pos_ && line_pos_ < text_.size(); ++line_pos_) line_ += text_[line_pos_] == '\n';
    return line_;
  }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  // Spaces within the current line only.
  void skip_blanks() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }

  bool peek(std::string_view token) {
    skip_space();
    return text_.substr(pos_, token.size()) == token;
  }
  bool accept(std::string_view token) {
    if (!peek(token)) return false;
    pos_ += token.size();
    return true;
  }
  void expect(std::string_view token) {
    if (!accept(token)) error(fmt::format("expected '{}'", token));
  }
  bool peek_word(std::string_view w) {
    skip_space();
    size_t end = pos_ + w.size();
    return text_.substr(pos_, w.size()) == w && (end >= text_.size() || !is_name_char(text_[end]));
  }
  void expect_word(std::string_view w) {
    if (!peek_word(w)) error(fmt::format("expected '{}'", w));
    pos_ += w.size();
  }
  std::string word(const char* what) {
    skip_space();
    size_t begin = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    if (begin == pos_) error(fmt::format("expected {}", what));
    return std::string(text_.substr(begin, pos_ - begin));
  }
  int64_t integer(const char* what) {
    skip_space();
    size_t begin = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    std::string digits(text_.substr(begin, pos_ - begin));
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(digits.c_str(), &end, 10);
    if (digits.empty() || digits == "-" || end != digits.c_str() + digits.size() || errno == ERANGE) {
      pos_ = begin;
      error(fmt::format("expected {}", what));
    }
    return v;
  }
  // The text between a '{' (already consumed) and its matching '}', which is consumed.
  std::string braced(const char* what) {
    size_t begin = pos_;
    std::string closers = "}";
    while (pos_ < text_.size()) {
      char c = text_[pos_++];
      if (c == '[' || c == '{' || c == '(') {
        closers.push_back(c == '[' ? ']' : c == '{' ? '}' : ')');
      } else if (c == ']' || c == '}' || c == ')') {
        if (c != closers.back()) {
          --pos_;
          error(fmt::format("unbalanced '{}' in {}", c, what));
        }
        closers.pop_back();
        if (closers.empty()) return std::string(text_.substr(begin, pos_ - 1 - begin));
      }
    }
    pos_ = begin;
    error(fmt::format("expected '}}' closing {}", what));
  }

  // ---- pieces ----
  TensorType tensor_type() {
    skip_space();
    size_t begin = pos_;
    std::string dtype_name = word("a type like f32[4, 8]");
    TensorType type;
    if (!dtype_from_name(dtype_name, &type.dtype) || dtype_name != short_name(type.dtype)) {
      pos_ = begin;
      error("expected a type like f32[4, 8] (dtype one of bool, u8, i8, u32, i32, i64, f16, bf16, f32, f64)");
    }
    if (pos_ >= text_.size() || text_[pos_] != '[') error("expected '[' after the dtype of a type");
    ++pos_;
    if (!accept("]")) {
      do {
        int64_t d = integer("a dimension");
        if (d < 0) error("expected a non-negative dimension");
        type.shape.push_back(d);
      } while (accept(","));
      expect("]");
    }
    return type;
  }

  std::string value_name() {
    expect("%");
    if (pos_ >= text_.size() || !is_name_char(text_[pos_])) error("expected a value name after '%'");
    return "%" + word("a value name");
  }

  ValueId use(const std::string& name) {
    auto it = names_.find(name);
    if (it == names_.end()) error(fmt::format("value {} is used before it is defined", name));
    return it->second;
  }

  void define(const std::string& name, ValueId id, int at_line) {
    if (!names_.emplace(name, id).second) {
      fail<ValueError>("parse_graph: line {}: value {} is defined twice", at_line, name);
    }
  }

  void parse_parameters() {
    expect("(");
    if (accept(")")) return;
    do {
      int at = line();
      std::string name = value_name();
      expect(":");
      define(name, graph_.add_parameter(tensor_type()), at);
    } while (accept(","));
    expect(")");
  }

  std::vector<TensorType> parse_result_types() {
    std::vector<TensorType> types;
    expect("(");
    if (accept(")")) return types;
    do types.push_back(tensor_type());
    while (accept(","));
    expect(")");
    return types;
  }

  void parse_statement() {
    int at = line();
    std::vector<std::string> results;
    if (!peek("=")) {
      do results.push_back(value_name());
      while (accept(","));
    }
    expect("=");
    if (peek_word("constant")) {
      if (results.size() != 1) {
        fail<ValueError>("parse_graph: line {}: a constant defines one value (got {})", at, results.size());
      }
      expect_word("constant");
      parse_constant(results[0], at);
      return;
    }
    std::string op = word("an op name or 'constant'");
    expect("(");
    std::vector<ValueId> inputs;
    if (!accept(")")) {
      do inputs.push_back(use(value_name()));
      while (accept(","));
      expect(")");
    }
    skip_blanks();
    std::string attributes;
    if (accept("{")) attributes = braced(fmt::format("the attributes of {}", op).c_str());
    expect(":");
    std::vector<TensorType> types;
    if (!results.empty()) {
      do types.push_back(tensor_type());
      while (accept(","));
    }
    if (types.size() != results.size()) {
      fail<ValueError>("parse_graph: line {}: {} defines {} values but lists {} types", at, op, results.size(),
                       types.size());
    }
    PrimitivePtr primitive;
    try {
      primitive = make_primitive(op, attributes);
    } catch (const ValueError& e) {
      fail<ValueError>("parse_graph: line {}: {}", at, e.what());
    }
    std::vector<ValueId> outs = graph_.add_node(std::move(primitive), std::move(inputs), std::move(types));
    for (size_t i = 0; i < outs.size(); ++i) define(results[i], outs[i], at);
    parse_remat();
  }

  // "  #remat region=N name=X" after a node's types (to the end of the line).
  void parse_remat() {
    skip_blanks();
    if (text_.substr(pos_, 6) != "#remat") return;
    pos_ += 6;
    Node& node = graph_.nodes.back();
    skip_blanks();
    if (text_.substr(pos_, 7) == "region=") {
      pos_ += 7;
      int64_t region = integer("a remat region number");
      if (region < 0 || region > 1'000'000) error("expected a remat region number in [0, 1000000]");
      node.remat_region = static_cast<int>(region);
      // The policy is not part of the text: the region keeps the default one.
      if (graph_.remat_regions.size() <= static_cast<size_t>(region)) {
        graph_.remat_regions.resize(static_cast<size_t>(region) + 1);
      }
      skip_blanks();
    }
    if (text_.substr(pos_, 5) == "name=") {
      pos_ += 5;
      size_t end = text_.find('\n', pos_);
      if (end == std::string_view::npos) end = text_.size();
      std::string_view name = text_.substr(pos_, end - pos_);
      while (!name.empty() && (name.back() == ' ' || name.back() == '\r')) name.remove_suffix(1);
      node.remat_name = std::string(name);
      pos_ = end;
    }
    skip_blanks();
    if (pos_ < text_.size() && text_[pos_] != '\n') error("expected 'region=N' or 'name=X' after '#remat'");
  }

  void parse_constant(const std::string& name, int at) {
    expect("{");
    std::string attributes = braced("the attributes of a constant");
    expect(":");
    TensorType type = tensor_type();
    Array data;
    try {
      AttributeMap map("constant", attributes);
      data = map.has("value") ? inline_constant(map, type) : supplied_constant(map, type);
      map.check_all_read();
    } catch (const ValueError& e) {
      fail<ValueError>("parse_graph: line {}: {}", at, e.what());
    }
    define(name, graph_.add_constant(data), at);
  }

  // {value=1} or {value=[1, 2, 3]}: the elements as doubles (fmt's round-trip spelling).
  static Array inline_constant(const AttributeMap& map, const TensorType& type) {
    std::string text = map.raw("value");
    std::vector<std::string> items;
    if (!text.empty() && text.front() == '[') {
      if (text.back() != ']') fail<ValueError>("constant: value '{}' has no closing ']'", text);
      std::string inner = text.substr(1, text.size() - 2);
      size_t begin = 0;
      while (inner.find_first_not_of(kSpace) != std::string::npos) {
        size_t comma = inner.find(',', begin);
        items.push_back(inner.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
        if (comma == std::string::npos) break;
        begin = comma + 1;
      }
    } else {
      items.push_back(text);
    }
    int64_t n = numel(type.shape);
    if (static_cast<int64_t>(items.size()) != n) {
      fail<ValueError>("constant: value '{}' has {} elements but the type {} has {}", text, items.size(),
                       to_string(type), n);
    }
    Array data = Array::empty(type.shape, type.dtype);
    for (int64_t i = 0; i < n; ++i) {
      std::string item = items[static_cast<size_t>(i)];
      size_t first = item.find_first_not_of(kSpace), last = item.find_last_not_of(kSpace);
      item = first == std::string::npos ? "" : item.substr(first, last - first + 1);
      char* end = nullptr;
      double v = std::strtod(item.c_str(), &end);
      if (item.empty() || end != item.c_str() + item.size()) {
        fail<ValueError>("constant: element '{}' of value '{}' is not a number", item, text);
      }
      store_from_double(type.dtype, data.mutable_raw_data(), i, v);
    }
    return data;
  }

  // {bytes=N, hash=H}: the next array of `constants`, checked against the text.
  Array supplied_constant(const AttributeMap& map, const TensorType& type) {
    int64_t bytes = map.get_int("bytes");
    std::string hash = map.raw("hash");
    if (next_constant_ >= constants_.size()) {
      fail<ValueError>("constant: the text reads constant #{} ({}, {} bytes) but only {} arrays were given",
                       next_constant_, to_string(type), bytes, constants_.size());
    }
    const Array& data = constants_[next_constant_++];
    data.eval();
    if (type_of(data) != type || static_cast<int64_t>(data.nbytes()) != bytes) {
      fail<ValueError>("constant: array #{} is {} ({} bytes) but the text expects {} ({} bytes)", next_constant_ - 1,
                       to_string(type_of(data)), data.nbytes(), to_string(type), bytes);
    }
    std::string actual = fmt::format("{:016x}", constant_fingerprint(data));
    if (actual != hash) {
      fail<ValueError>("constant: array #{} ({}) has hash {} but the text expects {}", next_constant_ - 1,
                       to_string(type), actual, hash);
    }
    return data;
  }

  void parse_return(const std::vector<TensorType>& result_types, int at) {
    skip_blanks();
    if (pos_ < text_.size() && text_[pos_] == '%') {
      do graph_.outputs.push_back(use(value_name()));
      while (accept(","));
    }
    if (graph_.outputs.size() != result_types.size()) {
      fail<ValueError>("parse_graph: line {}: return lists {} values but the header declares {} results", at,
                       graph_.outputs.size(), result_types.size());
    }
    for (size_t i = 0; i < result_types.size(); ++i) {
      if (graph_.type(graph_.outputs[i]) != result_types[i]) {
        fail<ValueError>("parse_graph: line {}: result {} is {} but the header declares {}", at, i,
                         to_string(graph_.type(graph_.outputs[i])), to_string(result_types[i]));
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  mutable size_t line_pos_ = 0;
  mutable int line_ = 1;
  const std::vector<Array>& constants_;
  size_t next_constant_ = 0;
  Graph graph_;
  std::map<std::string, ValueId> names_;
};

}  // namespace

Graph parse_graph(const std::string& text, const std::vector<Array>& constants) {
  return Parser(text, constants).parse();
}

TensorType parse_type(const std::string& text) {
  const std::vector<Array> none;
  return Parser(text, none).parse_type();
}

}  // namespace tessera::compiler
