// Rebuilding primitives from their IR spelling: name + attributes() text -> a
// Primitive. The IR parser and executable deserialization use it. Every primitive
// whose attributes() it can read back is registered here, so
// make_primitive(p->name(), p->attributes()) is equivalent to p.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/ir/primitive.h"

namespace tessera::compiler {

// "k=v, k=[1, 2], body={...}" split at top-level commas (brackets, braces and
// parentheses nest). Typed getters throw ValueError naming the op and key.
class AttributeMap {
 public:
  AttributeMap(std::string op, const std::string& text);
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  const std::string& raw(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  DType get_dtype(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;  // "[1, 2, 3]"
  Shape get_shape(const std::string& key) const { return get_ints(key); }
  // Throws ValueError naming a key that no getter read (misspelt or foreign);
  // make_primitive calls it after the factory.
  void check_all_read() const;

 private:
  std::string op_;
  std::string text_;
  std::map<std::string, std::string> values_;
  mutable std::set<std::string> read_;
};

using PrimitiveFactory = std::function<PrimitivePtr(const AttributeMap&)>;

// Throws ValueError for an unknown name or unreadable attributes.
PrimitivePtr make_primitive(const std::string& name, const std::string& attributes);
// Adds or replaces a factory (backends and tests register their own primitives).
void register_primitive(const std::string& name, PrimitiveFactory factory);

}  // namespace tessera::compiler
