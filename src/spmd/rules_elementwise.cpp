// Sharding rules for elementwise primitives (numpy broadcasting): every operand is
// laid out like the output; a value that is a partial sum stays partial through the
// linear ones (add/sub of partials, neg, a product or quotient with one partial
// factor), and is reduced before anything else.
#include "spmd/rules.h"
#include "tessera/ir/primitives/elementwise.h"

namespace tessera::spmd::rules {

Sharding project(const Sharding& target, const Shape& in, const Shape& out) {
  int rank = static_cast<int>(in.size());
  int offset = static_cast<int>(out.size()) - rank;
  Sharding s = Sharding::replicated(target.mesh(), rank).with_partial(target.partial_axes());
  for (int d = 0; d < rank; ++d)
    if (in[static_cast<size_t>(d)] == out[static_cast<size_t>(d + offset)])
      s = s.with_dim_axes(d, target.dim_axes(d + offset));
  return s;
}

namespace {

// Which operands may stay partial on the same axes for the output to be partial.
enum class Linearity { None, AllPartial, OnePartialFactor, Numerator };

Decision elementwise(const Context& c, Linearity linearity) {
  std::vector<int> operands;
  for (size_t i = 0; i < c.in.size(); ++i) operands.push_back(static_cast<int>(i));
  Sharding target = elementwise_target(c, operands, false);
  const Shape& out = c.out_types.at(0).shape;
  Decision d;
  // Partial axes the output may keep.
  std::vector<int> keep;
  if (linearity == Linearity::AllPartial) {
    // Partial operands that agree stay partial; the others (not split on those axes)
    // are made partial for free (zeros off the group's first member), so a sum of
    // partial and replicated terms needs one reduction at the end, not one per term.
    for (const Sharding& s : c.in) {
      if (!s.is_partial()) continue;
      if (keep.empty()) {
        keep = s.partial_axes();
      } else if (s.partial_axes() != keep) {
        keep.clear();
        break;
      }
    }
    for (const Sharding& s : c.in)
      for (int a : keep)
        if (s.sharded_dim(a) >= 0) keep.clear();
  } else if (linearity == Linearity::OnePartialFactor && c.in.size() == 2) {
    const Sharding& a = c.in[0];
    const Sharding& b = c.in[1];
    if (a.is_partial() != b.is_partial()) keep = a.is_partial() ? a.partial_axes() : b.partial_axes();
  } else if (linearity == Linearity::Numerator && c.in.size() == 2) {
    if (!c.in[1].is_partial()) keep = c.in[0].partial_axes();
  }
  // An axis the output keeps partial must not also split a dimension.
  for (int a : keep)
    if (target.sharded_dim(a) >= 0) keep.clear();
  for (size_t i = 0; i < c.in.size(); ++i) {
    Sharding want = project(target, c.in_types[i].shape, out);
    bool partial = !keep.empty() && (linearity == Linearity::AllPartial || c.in[i].partial_axes() == keep);
    d.inputs.push_back(partial ? want.with_partial(keep) : want.without_partial());
  }
  d.outputs.assign(c.out_types.size(), target.with_partial(keep));
  return d;
}

// Summing the cotangents of one value (AccumulateAdd): as an add, but when the terms'
// layouts conflict the first term's layout wins and the others are resharded to it.
Decision accumulate_add(const Context& c) {
  try {
    return elementwise(c, Linearity::AllPartial);
  } catch (const ShardingError&) {
    const Sharding target = c.in.at(0).without_partial();
    Decision d;
    for (size_t i = 0; i < c.in.size(); ++i)
      d.inputs.push_back(project(target, c.in_types[i].shape, c.out_types[0].shape));
    d.outputs.assign(c.out_types.size(), target);
    return d;
  }
}

}  // namespace

void register_elementwise() {
  const UnaryKind linear_unary[] = {UnaryKind::Neg, UnaryKind::Copy};
  for (int k = 0; k < kNumUnaryKinds; ++k) {
    auto kind = static_cast<UnaryKind>(k);
    bool linear = std::find(std::begin(linear_unary), std::end(linear_unary), kind) != std::end(linear_unary);
    add(unary_name(kind),
        [linear](const Context& c) { return elementwise(c, linear ? Linearity::AllPartial : Linearity::None); });
  }
  for (int k = 0; k < kNumBinaryKinds; ++k) {
    auto kind = static_cast<BinaryKind>(k);
    Linearity l = kind == BinaryKind::Add || kind == BinaryKind::Sub ? Linearity::AllPartial
                  : kind == BinaryKind::Mul                          ? Linearity::OnePartialFactor
                  : kind == BinaryKind::Div                          ? Linearity::Numerator
                                                                     : Linearity::None;
    add(binary_name(kind), [l](const Context& c) { return elementwise(c, l); });
  }
  add("accumulate_add", accumulate_add);
  add("where", [](const Context& c) { return elementwise(c, Linearity::None); });
  // Float conversions are linear up to rounding (the reduction happens in the target
  // dtype, as it would after the conversion).
  add("convert", [](const Context& c) {
    bool to_float = is_floating(c.out_types.at(0).dtype) && is_floating(c.in_types.at(0).dtype);
    return elementwise(c, to_float ? Linearity::AllPartial : Linearity::None);
  });
  add("stop_gradient", [](const Context& c) { return elementwise(c, Linearity::AllPartial); });
  add("identity", [](const Context& c) { return elementwise(c, Linearity::AllPartial); });
}

}  // namespace tessera::spmd::rules
