#include "tessera/core/tree.h"

namespace tessera {

const Array& Tree::leaf() const {
  if (!is_leaf()) fail<ValueError>("Tree::leaf: node is a {} (expected a leaf)", is_dict() ? "dict" : "list");
  return std::get<Array>(node_);
}

Tree& Tree::operator[](const std::string& key) {
  if (!is_dict()) fail<ValueError>("Tree[\"{}\"]: node is not a dict", key);
  return std::get<Dict>(node_)[key];
}

const Tree& Tree::at(const std::string& key) const {
  if (!is_dict()) fail<ValueError>("Tree::at(\"{}\"): node is not a dict", key);
  const Dict& d = std::get<Dict>(node_);
  auto it = d.find(key);
  if (it == d.end()) fail<ValueError>("Tree::at: no key \"{}\"", key);
  return it->second;
}

Tree& Tree::operator[](size_t index) {
  if (!is_list()) fail<ValueError>("Tree[{}]: node is not a list", index);
  List& l = std::get<List>(node_);
  if (index >= l.size()) fail<ValueError>("Tree[{}]: index out of range for a list of {}", index, l.size());
  return l[index];
}

const Tree& Tree::at(size_t index) const {
  if (!is_list()) fail<ValueError>("Tree::at({}): node is not a list", index);
  const List& l = std::get<List>(node_);
  if (index >= l.size()) fail<ValueError>("Tree::at({}): index out of range for a list of {}", index, l.size());
  return l[index];
}

const Tree::Dict& Tree::items() const {
  if (!is_dict()) fail<ValueError>("Tree::items: node is not a dict");
  return std::get<Dict>(node_);
}

const Tree::List& Tree::elements() const {
  if (!is_list()) fail<ValueError>("Tree::elements: node is not a list");
  return std::get<List>(node_);
}

size_t Tree::size() const {
  if (is_dict()) return std::get<Dict>(node_).size();
  if (is_list()) return std::get<List>(node_).size();
  return 1;
}

void Tree::collect(std::vector<Array>& leaves, std::vector<std::string>* paths, const std::string& prefix) const {
  if (is_leaf()) {
    leaves.push_back(std::get<Array>(node_));
    if (paths) paths->push_back(prefix);
    return;
  }
  auto child_prefix = [&](const std::string& key) { return prefix.empty() ? key : prefix + "." + key; };
  if (is_dict()) {
    for (const auto& [key, child] : std::get<Dict>(node_)) child.collect(leaves, paths, child_prefix(key));
  } else {
    const List& l = std::get<List>(node_);
    for (size_t i = 0; i < l.size(); ++i) l[i].collect(leaves, paths, child_prefix(std::to_string(i)));
  }
}

std::vector<Array> Tree::leaves() const {
  std::vector<Array> out;
  collect(out, nullptr, "");
  return out;
}

std::vector<std::string> Tree::paths() const {
  std::vector<Array> leaves;
  std::vector<std::string> out;
  collect(leaves, &out, "");
  return out;
}

Tree Tree::rebuild(const std::vector<Array>& leaves, size_t& next) const {
  if (is_leaf()) {
    if (next >= leaves.size()) fail<ValueError>("Tree::with_leaves: too few leaves ({})", leaves.size());
    return Tree(leaves[next++]);
  }
  if (is_dict()) {
    Dict d;
    for (const auto& [key, child] : std::get<Dict>(node_)) d.emplace(key, child.rebuild(leaves, next));
    return Tree(Node(std::move(d)));
  }
  List l;
  for (const Tree& child : std::get<List>(node_)) l.push_back(child.rebuild(leaves, next));
  return Tree(Node(std::move(l)));
}

Tree Tree::with_leaves(const std::vector<Array>& leaves) const {
  size_t next = 0;
  Tree out = rebuild(leaves, next);
  if (next != leaves.size())
    fail<ValueError>("Tree::with_leaves: {} leaves given for a tree of {}", leaves.size(), next);
  return out;
}

Tree Tree::map(const std::function<Array(const Array&)>& fn) const {
  std::vector<Array> out;
  for (const Array& a : leaves()) out.push_back(fn(a));
  return with_leaves(out);
}

bool Tree::same_structure(const Tree& other) const {
  if (paths() != other.paths()) return false;
  std::vector<Array> a = leaves(), b = other.leaves();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype()) return false;
  return true;
}

Tree tree_map(const std::function<Array(const Array&, const Array&)>& fn, const Tree& a, const Tree& b) {
  if (a.paths() != b.paths()) fail<ValueError>("tree_map: the two trees have different structures");
  std::vector<Array> la = a.leaves(), lb = b.leaves(), out;
  for (size_t i = 0; i < la.size(); ++i) out.push_back(fn(la[i], lb[i]));
  return a.with_leaves(out);
}

}  // namespace tessera
