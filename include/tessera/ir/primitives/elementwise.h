// Elementwise primitives. Binary and Where broadcast their inputs numpy-style
// (the kernels read broadcast inputs with zero strides; no broadcast copy is made),
// so their vjps sum cotangents back to each input's shape.
#pragma once

#include "tessera/base/dtype.h"
#include "tessera/base/op_list.h"
#include "tessera/ir/primitive.h"

namespace tessera {

// UnaryKind, BinaryKind and their IR names: base/op_list.h.

class Unary : public Primitive {
 public:
  explicit Unary(UnaryKind kind) : kind_(kind) {}
  UnaryKind kind() const { return kind_; }
  std::string name() const override { return unary_name(kind_); }
  bool can_write_in_place(int, int) const override { return true; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  UnaryKind kind_;
};

class Binary : public Primitive {
 public:
  explicit Binary(BinaryKind kind) : kind_(kind) {}
  BinaryKind kind() const { return kind_; }
  std::string name() const override { return binary_name(kind_); }
  bool can_write_in_place(int, int) const override { return true; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  TESSERA_PRIMITIVE_COMPOSITE

 private:
  BinaryKind kind_;
};

// The add a reverse-mode transform uses to sum the cotangents of a value read more than
// once (JAX's add_any). It computes and prints as `add`; it differs only in its sharding
// rule: the cotangents of one value may arrive laid out differently, and since the user
// never wrote this add (and cannot pin it), the first cotangent's layout wins where a
// plain add would ask for a constraint.
class AccumulateAdd : public Binary {
 public:
  AccumulateAdd() : Binary(BinaryKind::Add) {}
  std::string sharding_rule_key() const override { return "accumulate_add"; }
};

// where(cond, a, b), broadcasting all three.
class Where : public Primitive {
 public:
  std::string name() const override { return "where"; }
  bool can_write_in_place(int input, int) const override { return input > 0; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
};

class Cast : public Primitive {
 public:
  explicit Cast(DType dtype) : dtype_(dtype) {}
  std::string name() const override { return "convert"; }
  std::string attributes() const override;
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP

 private:
  DType dtype_;
};

// Identity whose cotangent is zero.
class StopGradient : public Primitive {
 public:
  std::string name() const override { return "stop_gradient"; }
  int aliases_input(int) const override { return 0; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  Cost cost(const std::vector<Array>&, const std::vector<Array>&) const override { return {}; }
};

// Identity: the tracer a transform puts between a function and its inputs. Shares
// its input's buffer.
class Identity : public Primitive {
 public:
  std::string name() const override { return "identity"; }
  int aliases_input(int) const override { return 0; }
  TESSERA_PRIMITIVE_EVAL
  TESSERA_PRIMITIVE_VJP
  TESSERA_PRIMITIVE_VMAP
  Cost cost(const std::vector<Array>&, const std::vector<Array>&) const override { return {}; }
};

}  // namespace tessera
