// AttributeMap: a primitive's attributes() text read back into typed values.
// "k=v, k=[1, 2], body={...}" is split at top-level commas (brackets, braces and
// parentheses nest); each typed getter throws ValueError naming the op and the key.
// The IR parser, executable deserialization and primitives that parse their own
// attribute bodies (fusion programs, matmul epilogues) all read attributes here.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"

namespace tessera {

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

}  // namespace tessera
