#include "api/jit_cache_index.h"

#include <fmt/format.h>

#include <string_view>

#include "tessera/base/error.h"
#include "tessera/base/version.h"

namespace tessera::compiler {

namespace {

// The structure text: a leaf is <dtype:d0,d1,...>, a dict {N:key child ...} (keys
// length-prefixed, in order), a list [child ...]. Compact and quick to read back: an
// index hit parses it for every argument and output leaf.
void write_structure(const Tree& tree, std::string& out) {
  if (tree.is_leaf()) {
    out += '<';
    out += short_name(tree.leaf().dtype());
    out += ':';
    const Shape& shape = tree.leaf().shape();
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(shape[i]);
    }
    out += '>';
  } else if (tree.is_list()) {
    out += '[';
    for (const Tree& t : tree.elements()) write_structure(t, out);
    out += ']';
  } else {
    out += '{';
    for (const auto& [key, t] : tree.items()) {
      out += std::to_string(key.size()) + ':' + key;
      write_structure(t, out);
    }
    out += '}';
  }
}

class StructureReader {
 public:
  explicit StructureReader(const std::string& text) : text_(text) {}

  Tree read() {
    Tree tree = node();
    if (at_ != text_.size()) bad("trailing characters");
    return tree;
  }

 private:
  [[noreturn]] void bad(const char* what) const {
    fail<ValueError>("compilation cache index: tree structure {:.80}: {} at character {}", text_, what, at_);
  }
  char next() {
    if (at_ >= text_.size()) bad("unexpected end");
    return text_[at_++];
  }
  int64_t number() {
    const size_t start = at_;
    int64_t n = 0;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9' && at_ - start < 18)
      n = n * 10 + (text_[at_++] - '0');
    if (at_ == start) bad("expected a number");
    return n;
  }
  Tree node() {
    if (++depth_ > 64) bad("nested too deeply");
    Tree tree;
    const char c = next();
    if (c == '<') {
      const size_t colon = text_.find(':', at_);
      DType dtype{};
      if (colon == std::string::npos || !dtype_from_name(std::string_view(text_).substr(at_, colon - at_), &dtype))
        bad("unknown dtype");
      at_ = colon + 1;
      Shape shape;
      while (at_ < text_.size() && text_[at_] != '>') {
        if (!shape.empty() && next() != ',') bad("expected ','");
        shape.push_back(number());
      }
      next();  // '>'
      tree = Tree(Array::placeholder(shape, dtype));
    } else if (c == '[') {
      Tree::List items;
      while (at_ < text_.size() && text_[at_] != ']') items.push_back(node());
      next();  // ']'
      tree = Tree::list(std::move(items));
    } else if (c == '{') {
      Tree::Dict items;
      while (at_ < text_.size() && text_[at_] != '}') {
        const auto n = static_cast<size_t>(number());
        if (next() != ':' || text_.size() - at_ < n) bad("bad key");
        std::string key = text_.substr(at_, n);
        at_ += n;
        items.emplace(std::move(key), node());
      }
      next();  // '}'
      tree = Tree::dict(std::move(items));
    } else {
      bad("expected '<', '[' or '{'");
    }
    --depth_;
    return tree;
  }

  const std::string& text_;
  size_t at_ = 0;
  int depth_ = 0;
};

std::string types_text(const std::vector<TensorType>& types) {
  std::string s;
  for (const TensorType& t : types) s += (s.empty() ? "" : ", ") + to_string(t);
  return "(" + s + ")";
}

}  // namespace

IndexKey jit_index_key(const JitOptions& options, const Tree& args, const std::string& signature,
                       const std::vector<bool>& donated) {
  std::string donation;
  for (bool d : donated) donation += d ? '1' : '0';
  IndexKey key;
  key.parts = {{"jit", options.name},
               {"identity", options.cache_identity},
               {"arguments", tree_structure_text(args)},
               {"signature", signature},
               {"donation", donation},
               {"options", compile_options_text(options.compile)},
               {"device", options.device},
               {"compiler_version", tessera::version()},
               {"build", build_identity()},
               {"format_version", fmt::format("index={},entry={},executable={}", kCompilationIndexFormatVersion,
                                              kCompilationCacheFormatVersion, kExecutableFormatVersion)}};
  return key;
}

std::string tree_structure_text(const Tree& tree) {
  std::string out;
  write_structure(tree, out);
  return out;
}

Tree tree_structure_from_text(const std::string& text) { return StructureReader(text).read(); }

std::string index_hit_mismatch(const Executable& executable, const std::vector<Array>& leaves,
                               const std::vector<bool>& donated, const Tree& outputs) {
  // Compared in place (every warm start checks a few hundred leaves); the type lists
  // are only spelt out for the warning of a mismatch.
  const Graph& g = executable.graph();
  const std::vector<Array> out_leaves = outputs.leaves();
  auto fits = [&g](const std::vector<Array>& arrays, const std::vector<ValueId>& values) {
    if (arrays.size() != values.size()) return false;
    for (size_t i = 0; i < arrays.size(); ++i) {
      const TensorType& t = g.value(values[i]).type;
      if (arrays[i].dtype() != t.dtype || arrays[i].shape() != t.shape) return false;
    }
    return true;
  };
  auto types_of = [](const std::vector<Array>& arrays) {
    std::vector<TensorType> types;
    for (const Array& a : arrays) types.push_back({a.shape(), a.dtype()});
    return types;
  };
  auto value_types = [&g](const std::vector<ValueId>& values) {
    std::vector<TensorType> types;
    for (ValueId v : values) types.push_back(g.value(v).type);
    return types;
  };
  if (!fits(leaves, g.parameters))
    return fmt::format("its program takes {} but the call passes {}", types_text(value_types(g.parameters)),
                       types_text(types_of(leaves)));
  if (!fits(out_leaves, g.outputs))
    return fmt::format("its program returns {} but its output tree holds {}", types_text(value_types(g.outputs)),
                       types_text(types_of(out_leaves)));
  std::vector<bool> have_donated = executable.donated();
  have_donated.resize(leaves.size(), false);
  if (have_donated != donated) return "its program donates other arguments than the call";
  return "";
}

}  // namespace tessera::compiler
