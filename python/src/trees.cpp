// C++ Trees <-> Python pytrees of the training stack: a dict with str keys is a Tree
// dict, a list or tuple a Tree list, anything else a leaf array.
#include "trees.h"

#include <fmt/format.h>

namespace tessera::python {

Tree to_tree(nb::handle value, const std::string& path) {
  if (nb::isinstance<nb::dict>(value)) {
    Tree::Dict items;
    for (auto [k, v] : nb::cast<nb::dict>(value)) {
      if (!nb::isinstance<nb::str>(k))
        throw nb::type_error(fmt::format("{}: tessera trees have str keys, got {}", path.empty() ? "tree" : path,
                                         nb::cast<std::string>(nb::repr(k)))
                                 .c_str());
      const std::string key = nb::cast<std::string>(k);
      items.emplace(key, to_tree(v, path.empty() ? key : path + "." + key));
    }
    return Tree::dict(std::move(items));
  }
  if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
    Tree::List items;
    size_t i = 0;
    for (nb::handle v : nb::iter(value)) {
      const std::string p = path.empty() ? std::to_string(i) : path + "." + std::to_string(i);
      items.push_back(to_tree(v, p));
      ++i;
    }
    return Tree::list(std::move(items));
  }
  const std::string what = path.empty() ? "tree leaf" : "tree leaf '" + path + "'";
  return Tree(as_array(value, what.c_str()));
}

nb::object from_tree(const Tree& tree) {
  if (tree.is_leaf()) return nb::cast(tree.leaf());
  if (tree.is_list()) {
    nb::list out;
    for (const Tree& t : tree.elements()) out.append(from_tree(t));
    return out;
  }
  nb::dict out;
  for (const auto& [k, t] : tree.items()) out[nb::str(k.c_str())] = from_tree(t);
  return out;
}

}  // namespace tessera::python
