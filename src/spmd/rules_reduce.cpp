// Sharding rules for reductions. A sum over a split dimension is a partial sum on
// that dimension's axes (reduced later, where the value is needed); max, min and
// prod over a split dimension gather it first (the communicators reduce sums only).
#include "spmd/rules.h"
#include "tessera/ir/primitives/reduce.h"

namespace tessera::spmd::rules {

namespace {

Decision reduce_rule(const Context& c) {
  const auto& p = static_cast<const Reduce&>(c.primitive);
  bool sum = p.kind() == ReduceKind::Sum;
  Sharding in = sum ? c.in[0] : c.in[0].without_partial();
  std::vector<int> partial = sum ? in.partial_axes() : std::vector<int>{};
  Sharding out = Sharding::replicated(c.mesh, static_cast<int>(c.out_types[0].shape.size()));
  int o = 0;
  for (int d = 0; d < in.rank(); ++d) {
    bool reduced = std::find(p.axes().begin(), p.axes().end(), d) != p.axes().end();
    if (!reduced) {
      out = out.with_dim_axes(o++, in.dim_axes(d));
    } else if (sum) {
      partial.insert(partial.end(), in.dim_axes(d).begin(), in.dim_axes(d).end());
    } else {
      in = in.with_dim_axes(d, {});
    }
  }
  Decision dec;
  dec.inputs = {in};
  dec.outputs = {out.with_partial(partial)};
  return dec;
}

Decision arg_reduce_rule(const Context& c) {
  int axis = static_cast<const ArgReduce&>(c.primitive).axis();
  Sharding in = c.in[0].without_partial().with_dim_axes(axis, {});
  Sharding out = Sharding::replicated(c.mesh, static_cast<int>(c.out_types[0].shape.size()));
  int o = 0;
  for (int d = 0; d < in.rank(); ++d)
    if (d != axis) out = out.with_dim_axes(o++, in.dim_axes(d));
  Decision dec;
  dec.inputs = {in};
  dec.outputs = {out};
  return dec;
}

}  // namespace

void register_reduce() {
  for (const char* name : {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}) add(name, reduce_rule);
  add("argmax", arg_reduce_rule);
  add("argmin", arg_reduce_rule);
}

}  // namespace tessera::spmd::rules
