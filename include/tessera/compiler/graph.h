// The compiler's IR: one function in SSA form. Values are parameters (the
// function's inputs, bound per call), constants (arrays captured at trace time) or
// outputs of nodes; a node applies one Primitive. `nodes` is kept in a valid
// execution order and that order is the schedule: passes that insert nodes insert
// them where they should run.
//
// Text form (stable; tests compare it, TESSERA_DUMP writes it, the parser reads it):
//
//   func @main(%0: f32[4, 8], %1: f32[8]) -> (f32[4, 8]) {
//     %2 = constant {value=1} : f32[]
//     %3 = broadcast_to(%1) {shape=[4, 8]} : f32[4, 8]
//     %4 = add(%0, %3) : f32[4, 8]
//     return %4
//   }
//
// Names are assigned in print order (parameters, then constants, then node
// outputs), so equal graphs print equal text whatever their internal ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/core/array.h"
#include "tessera/core/checkpoint.h"
#include "tessera/ir/primitive.h"

namespace tessera::compiler {

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

struct TensorType {
  Shape shape;
  DType dtype = DType::Float32;
  size_t nbytes() const { return static_cast<size_t>(numel(shape)) * itemsize(dtype); }
  bool operator==(const TensorType& o) const { return shape == o.shape && dtype == o.dtype; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};
// "f32[4, 8]" (the same spelling as type_string(Array)).
std::string to_string(const TensorType& type);
TensorType type_of(const Array& a);
// The hash a large constant prints in the text form (FNV-1a of its bytes); the parser
// checks supplied constants against it.
uint64_t constant_fingerprint(const Array& data);

enum class ValueKind { Parameter, Constant, NodeOutput };

struct Value {
  TensorType type;
  ValueKind kind = ValueKind::NodeOutput;
  int node = -1;  // producing node (NodeOutput); index into Graph::nodes
  int output_index = 0;
  Array constant;     // the data of a Constant (evaluated)
  bool dead = false;  // removed by a pass; compact() drops it
};

struct Node {
  PrimitivePtr primitive;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  // Rematerialization: the checkpoint region the op was traced in (-1: none) and
  // the name given with checkpoint_name (empty: none). See compiler/passes/remat.h.
  int remat_region = -1;
  std::string remat_name;
  bool dead = false;  // removed by a pass; compact() drops it
};

class Graph {
 public:
  std::string name = "main";
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<ValueId> parameters;
  std::vector<ValueId> outputs;
  std::vector<CheckpointPolicy> remat_regions;  // indexed by Node::remat_region

  // ---- building ----
  ValueId add_parameter(TensorType type);
  ValueId add_constant(const Array& data);  // evaluates `data`
  // Appends a node (or inserts it before node index `position`) and returns its
  // output values. Inserting renumbers the nodes after it (values stay valid).
  std::vector<ValueId> add_node(PrimitivePtr primitive, std::vector<ValueId> inputs, std::vector<TensorType> types);
  std::vector<ValueId> insert_node(int position, PrimitivePtr primitive, std::vector<ValueId> inputs,
                                   std::vector<TensorType> types);
  ValueId add_node1(PrimitivePtr primitive, std::vector<ValueId> inputs, TensorType type) {
    return add_node(std::move(primitive), std::move(inputs), {std::move(type)})[0];
  }

  // ---- queries ----
  const TensorType& type(ValueId v) const { return values.at(static_cast<size_t>(v)).type; }
  const Value& value(ValueId v) const { return values.at(static_cast<size_t>(v)); }
  // The node producing v, or nullptr for parameters and constants.
  const Node* producer(ValueId v) const;
  Node* producer(ValueId v);
  // For every value: the indices of the (live) nodes that read it, in schedule order.
  std::vector<std::vector<int>> users() const;
  // Live node count.
  size_t num_nodes() const;

  // ---- rewriting ----
  // Every use of `from` (node inputs and graph outputs) reads `to` instead.
  void replace_uses(ValueId from, ValueId to);
  // Marks a node and its outputs dead (the caller has removed their uses).
  void erase_node(int index);
  // Drops dead nodes and values and renumbers everything densely.
  void compact();

  // Checks SSA form, order (inputs defined before use), types and counts; throws
  // compiler errors (tessera::Error) naming the node on failure.
  void verify() const;

  // The stable text form (see the top of this file).
  std::string text() const;
};

}  // namespace tessera::compiler
