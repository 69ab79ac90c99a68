// Rebuilding primitives from their IR spelling: name + attributes() text -> a
// Primitive. The IR parser and executable deserialization use it. Every primitive
// whose attributes() it can read back is registered here, so
// make_primitive(p->name(), p->attributes()) is equivalent to p.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/error.h"
#include "tessera/base/shape.h"
#include "tessera/ir/attributes.h"
#include "tessera/ir/primitive.h"

namespace tessera::compiler {

using PrimitiveFactory = std::function<PrimitivePtr(const AttributeMap&)>;

// A name with neither a factory nor a registered custom op (core/custom_op.h): the
// compilation cache treats an entry that needs one as a miss, not as corrupt, since a
// process that registers the op can still use it.
class UnregisteredOpError : public ValueError {
 public:
  using ValueError::ValueError;
  UnregisteredOpError(const std::string& message, std::string op) : ValueError(message), op_(std::move(op)) {}
  const std::string& op() const { return op_; }

 private:
  std::string op_;
};

// Names without a factory are looked up among the custom ops. Throws
// UnregisteredOpError for a name that is neither, ValueError for unreadable attributes.
PrimitivePtr make_primitive(const std::string& name, const std::string& attributes);
// Adds or replaces a factory (backends and tests register their own primitives).
void register_primitive(const std::string& name, PrimitiveFactory factory);
// Every op name with a factory, sorted (the op-coverage test walks it).
std::vector<std::string> primitive_names();

}  // namespace tessera::compiler
