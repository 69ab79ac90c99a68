// Tree: nested named structures of arrays (model parameters, optimizer state,
// gradients). A node is a leaf Array, a dict (string keys, iterated in sorted order)
// or a list. Flattening is deterministic: the order of leaves() and paths() depends
// only on the structure, so trees are stable keys for checkpoints and sharding.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "tessera/core/array.h"

namespace tessera {

class Tree {
 public:
  using Dict = std::map<std::string, Tree>;
  using List = std::vector<Tree>;

  Tree() : node_(Dict{}) {}
  Tree(Array leaf) : node_(std::move(leaf)) {}  // NOLINT: implicit on purpose
  Tree(std::initializer_list<std::pair<const std::string, Tree>> items) : node_(Dict(items)) {}
  static Tree dict(Dict items = {}) { return Tree(Node(std::move(items))); }
  static Tree list(List items) { return Tree(Node(std::move(items))); }

  bool is_leaf() const { return std::holds_alternative<Array>(node_); }
  bool is_dict() const { return std::holds_alternative<Dict>(node_); }
  bool is_list() const { return std::holds_alternative<List>(node_); }

  const Array& leaf() const;
  // Dict access; operator[] on a non-const dict inserts like std::map.
  Tree& operator[](const std::string& key);
  const Tree& at(const std::string& key) const;
  // List access.
  Tree& operator[](size_t index);
  const Tree& at(size_t index) const;
  const Dict& items() const;
  const List& elements() const;
  size_t size() const;  // children of a dict/list, 1 for a leaf

  // Leaves in deterministic order, and their dotted paths ("layers.0.weight").
  std::vector<Array> leaves() const;
  std::vector<std::string> paths() const;
  // Same structure, leaves replaced in order; throws if the count differs.
  Tree with_leaves(const std::vector<Array>& leaves) const;
  Tree map(const std::function<Array(const Array&)>& fn) const;
  // Same structure (keys, list lengths) and leaf shapes/dtypes.
  bool same_structure(const Tree& other) const;

 private:
  using Node = std::variant<Array, Dict, List>;
  explicit Tree(Node node) : node_(std::move(node)) {}
  void collect(std::vector<Array>& leaves, std::vector<std::string>* paths, const std::string& prefix) const;
  Tree rebuild(const std::vector<Array>& leaves, size_t& next) const;
  Node node_;
};

// Elementwise combination of two trees of the same structure.
Tree tree_map(const std::function<Array(const Array&, const Array&)>& fn, const Tree& a, const Tree& b);

}  // namespace tessera
