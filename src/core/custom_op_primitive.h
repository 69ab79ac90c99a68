// Internal: the primitive every custom op application holds — the registered
// definition (shared, so a program keeps it after unregister_custom_op) and the call's
// attributes. Its rules delegate to the definition (src/core/primitives/custom.cpp);
// eval_cpu is in src/backend/cpu/custom_op_kernel.cpp.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/custom_op.h"

namespace tessera {

class CustomOp : public Primitive {
 public:
  CustomOp(std::shared_ptr<const CustomOpDefinition> definition, CustomAttributes attributes);

  std::string name() const override { return definition_->name; }
  std::string attributes() const override { return text_; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COST

  const CustomOpDefinition& definition() const { return *definition_; }
  const CustomAttributes& values() const { return attributes_; }

 private:
  std::shared_ptr<const CustomOpDefinition> definition_;
  CustomAttributes attributes_;
  std::string text_;  // attributes as printed, computed once (CSE and the cache compare it)
};

// "k=v, ..." in key order: ints as digits, doubles always with a '.', 'e', "inf" or
// "nan" (so they read back as doubles), strings quoted. Throws ValueError naming `op`
// and the key for a key or string the text cannot carry.
std::string print_custom_attributes(const std::string& op, const CustomAttributes& attributes);
CustomAttributes parse_custom_attributes(const std::string& op, const std::string& text);

// custom_op() for a definition in hand (rules re-issue the op without the registry).
std::vector<Array> apply_custom_op(const std::shared_ptr<const CustomOpDefinition>& definition,
                                   const std::vector<Array>& inputs, const CustomAttributes& attributes);

std::vector<TensorSpec> specs_of(const std::vector<Array>& arrays);

}  // namespace tessera
