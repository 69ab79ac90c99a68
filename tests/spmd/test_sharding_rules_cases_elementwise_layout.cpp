// Sharding-rule cases: elementwise ops, partial sums flowing into them, reductions
// and layout ops.
#include "sharding_rule_cases.h"

namespace tessera::sharding_cases {

std::vector<Case> elementwise_cases() {
  std::vector<Case> v;
  Fn tanh_fn = unary(tanh);
  Fn exp_fn = [](const std::vector<Array>& a) { return std::vector<Array>{exp(a[0])}; };
  v.push_back(make("tanh", "x=2", {{{8, 16}, P("x")}}, tanh_fn, true, "P('x')"));
  v.push_back(make("tanh", "x=4", {{{8, 16}, P(None, "x")}}, tanh_fn, true, "P(None, 'x')"));
  v.push_back(make("exp", "x=8", {{{8, 16}, P(Axes{}, "x")}}, exp_fn));
  v.push_back(make("exp", "a=2,b=4", {{{8, 16}, P("a", "b")}}, exp_fn, true, "P('a', 'b')"));
  v.push_back(make("exp", "a=2,b=2", {{{8, 16}, P(Axes{"a", "b"})}}, exp_fn, true, "P(('a', 'b'))"));
  Fn add_fn = [](const std::vector<Array>& a) { return std::vector<Array>{add(a[0], a[1])}; };
  Fn mul_fn = [](const std::vector<Array>& a) { return std::vector<Array>{multiply(a[0], a[1])}; };
  Fn div_fn = [](const std::vector<Array>& a) { return std::vector<Array>{divide(a[0], square(a[1]) + 1.0)}; };
  v.push_back(make("add", "x=4", {{{8, 16}, P("x")}, {{8, 16}, P("x")}}, add_fn, true, "P('x')"));
  v.push_back(make("add", "x=4", {{{8, 16}, P("x")}, {{8, 16}, P()}}, add_fn, true, "P('x')"));
  v.push_back(make("mul", "a=2,b=2", {{{8, 16}, P("a", "b")}, {{8, 16}, P("a")}}, mul_fn, true, "P('a', 'b')"));
  v.push_back(make("mul", "a=4,b=2", {{{8, 16}, P("b", "a")}, {{8, 16}, P(None, "a")}}, mul_fn));
  v.push_back(make("div", "a=2,b=4", {{{8, 16}, P("a", "b")}, {{8, 16}, P(None, "b")}}, div_fn));
  // Broadcasting: a bias row, a column, rank 3 against rank 2, a scalar argument.
  v.push_back(make("add_bias", "a=2,b=4", {{{8, 16}, P("a", "b")}, {{16}, P("b")}}, add_fn, true, "P('a', 'b')"));
  v.push_back(make("add_bias_conflict", "x=4", {{{8, 16}, P("x")}, {{16}, P("x")}}, add_fn, true, "P('x')"));
  v.push_back(make("mul_column", "x=8", {{{8, 16}, P(None, "x")}, {{8, 1}, P("x")}}, mul_fn));
  v.push_back(make("sub_rank3", "a=2,b=2", {{{4, 8, 16}, P("a", None, "b")}, {{8, 16}, P(None, "b")}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{subtract(a[0], a[1])}; }));
  v.push_back(make("mul_rank3_size1", "a=2,b=4", {{{4, 1, 16}, P("a", None, "b")}, {{8, 1}, P("b")}}, mul_fn));
  v.push_back(make("mul_scalar_arg", "x=2", {{{8, 16}, P("x")}, {{}, P()}}, mul_fn, true, "P('x')"));
  v.push_back(make("scalar_constants", "x=8", {{{16, 8}, P("x")}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{a[0] * 2.5 - 1.0}; }));
  // where (and the comparison that builds its condition), convert.
  Fn where_fn = [](const std::vector<Array>& a) {
    return std::vector<Array>{where(greater(a[0], a[1]), a[0], square(a[1]))};
  };
  v.push_back(make("where", "x=4", {{{8, 16}, P("x")}, {{8, 16}, P("x")}}, where_fn, true, "P('x')"));
  v.push_back(make("where_bcast", "a=2,b=2", {{{8, 16}, P("a", "b")}, {{16}, P("b")}}, where_fn));
  Fn where3 = [](const std::vector<Array>& a) { return std::vector<Array>{where(a[0], a[1], a[2])}; };
  v.push_back(make("where_bool_arg", "a=4,b=2", {{{8, 8}, P("a", "b"), Gen::Mask}, {{8, 8}, P("a")}, {{8, 8}, P()}},
                   where3, true, "P('a', 'b')"));
  // Equal-sized operands splitting one axis over different dims: no layout is better.
  Case conflict =
      make("where_conflict", "a=4,b=2", {{{8, 8}, P("a", "b"), Gen::Mask}, {{8, 8}, P("b")}, {{8, 8}, P()}}, where3);
  conflict.error = "split the output differently";
  v.push_back(conflict);
  v.push_back(make("convert_f64", "x=4", {{{8, 16}, P(None, "x")}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{astype(a[0], DType::Float64)}; }));
  v.push_back(make("convert_int", "a=2,b=2", {{{8, 16}, P("a", "b"), Gen::Index, 100}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{astype(a[0], DType::Int32)}; }));
  // Partial sums through linear ops: (sum over a split dim) + (sum over a split dim) * 2.
  v.push_back(make("partial_linear", "x=4", {{{8, 16}, P(None, "x")}, {{8, 16}, P(None, "x")}},
                   [](const std::vector<Array>& a) {
                     return std::vector<Array>{negative(add(sum(a[0], {1}), sum(a[1], {1}) * 2.0))};
                   }));
  return v;
}

// Partial sums (a sum over a split dim) flowing into the ops that keep them partial
// (linear in that operand) and into the ones that must reduce them first.
std::vector<Case> partial_cases() {
  std::vector<Case> v;
  // s = sum over the split dim 0: [16, 8] partial over the axes splitting dim 0.
  auto psum = [](const Array& a) { return sum(a, {0}); };
  Fn mul_div = [psum](const std::vector<Array>& a) {
    Array s = psum(a[0]);
    return std::vector<Array>{multiply(s, a[1]), divide(s, square(a[1]) + 1.0), divide(a[1], square(s) + 1.0),
                              multiply(s, psum(a[2]))};
  };
  v.push_back(make("partial_mul_div", "x=4", {{{4, 16, 8}, P("x")}, {{16, 8}, P()}, {{4, 16, 8}, P("x")}}, mul_div));
  v.push_back(make("partial_mul_div", "a=2,b=2", {{{4, 16, 8}, P("a", "b")}, {{16, 8}, P("b")}, {{4, 16, 8}, P("b")}},
                   mul_div));
  Fn layout_ops = [psum](const std::vector<Array>& a) {
    Array s = psum(a[0]);  // [16, 8]
    return std::vector<Array>{reshape(s, {4, 4, 8}),
                              s.T(),
                              slice(s, {2, 0}, {10, 8}, {1, 2}),
                              broadcast_to(s, {3, 16, 8}),
                              concatenate({s, psum(a[1])}, 1),
                              concatenate({s, a[2]}, 0)};
  };
  v.push_back(
      make("partial_layout_ops", "x=2", {{{4, 16, 8}, P("x")}, {{4, 16, 8}, P("x")}, {{16, 8}, P()}}, layout_ops));
  v.push_back(make("partial_layout_ops", "a=2,b=4",
                   {{{4, 16, 8}, P("a", "b")}, {{4, 16, 8}, P("a")}, {{16, 8}, P("b")}}, layout_ops));
  {
    // A value used twice whose two cotangents arrive split differently: the vjp's
    // accumulation add (AccumulateAdd) keeps the first cotangent's layout and
    // reshards the other (a plain add would ask for a constraint the user cannot place).
    Case c = make("grad_accumulation_conflict", "x=2", {{{8, 8}, P("x")}, {{8, 8}, P(None, "x")}},
                  [](const std::vector<Array>& a) {
                    return std::vector<Array>{a[0] * 2.0, concatenate({a[0], a[1]}, 0)};
                  });
    v.push_back(c);
  }
  Fn matmul_partial = [psum](const std::vector<Array>& a) {
    return std::vector<Array>{matmul(psum(a[0]), a[1]), matmul(a[1].T(), psum(a[0]).T())};
  };
  v.push_back(make("partial_matmul", "x=4", {{{4, 16, 32}, P("x")}, {{32, 24}, P()}}, matmul_partial));
  v.push_back(make("partial_matmul_n_split", "x=4", {{{4, 16, 32}, P("x")}, {{32, 24}, P(None, "x")}}, matmul_partial));
  v.push_back(
      make("partial_matmul", "a=2,b=2", {{{4, 16, 32}, P("a", "b")}, {{32, 24}, P(None, "a")}}, matmul_partial));
  v.push_back(make("partial_matmul_k_split", "a=4,b=2", {{{4, 16, 32}, P("a", None, "b")}, {{32, 24}, P("b")}},
                   matmul_partial));
  Fn nonlinear = [psum](const std::vector<Array>& a) {
    Array s = psum(a[0]);
    return std::vector<Array>{exp(s * 0.1), max(s, {1}), softmax(s), sum(s, {1})};
  };
  v.push_back(make("partial_into_nonlinear", "a=2,b=2", {{{4, 16, 8}, P("a", "b")}}, nonlinear));
  v.push_back(make("partial_into_nonlinear", "x=8", {{{8, 16, 8}, P("x")}}, nonlinear));
  return v;
}

std::vector<Case> reduce_cases() {
  std::vector<Case> v;
  auto reduce = [](Array (*f)(const Array&, const std::vector<int>&, bool), std::vector<int> axes, bool keep) -> Fn {
    return [f, axes, keep](const std::vector<Array>& a) { return std::vector<Array>{f(a[0], axes, keep)}; };
  };
  for (auto [name, f] : {std::pair{"sum", &sum}, std::pair{"max", &max}}) {
    std::string op = name;
    v.push_back(make(op + "_split_dim", "x=4", {{{8, 16}, P(None, "x")}}, reduce(f, {1}, false)));
    v.push_back(make(op + "_unsplit_dim", "x=4", {{{8, 16}, P(None, "x")}}, reduce(f, {0}, false), true, "P('x')"));
    v.push_back(make(op + "_keepdims", "x=2", {{{8, 16}, P("x")}}, reduce(f, {0}, true)));
    v.push_back(make(op + "_keepdims_other", "x=8", {{{8, 16}, P("x")}}, reduce(f, {1}, true), true, "P('x')"));
    v.push_back(make(op + "_all", "a=2,b=4", {{{8, 16}, P("a", "b")}}, reduce(f, {}, false)));
    v.push_back(make(op + "_one_of_two", "a=2,b=2", {{{8, 16}, P("a", "b")}}, reduce(f, {0}, false), true, "P('b')"));
    v.push_back(make(op + "_rank3", "a=4,b=2", {{{4, 8, 6}, P("a", "b")}}, reduce(f, {1}, false)));
    v.push_back(make(op + "_rank3_keep", "a=2,b=2", {{{4, 8, 6}, P("a", None, "b")}}, reduce(f, {0, 2}, true)));
  }
  v.push_back(make("mean_split", "a=2,b=4", {{{8, 16}, P("a", "b")}}, reduce(&mean, {1}, false)));
  Fn argmax1 = [](const std::vector<Array>& a) { return std::vector<Array>{argmax(a[0], 1)}; };
  Fn argmax0_keep = [](const std::vector<Array>& a) { return std::vector<Array>{argmax(a[0], 0, true)}; };
  v.push_back(make("argmax_split_dim", "x=4", {{{8, 16}, P(None, "x")}}, argmax1, false));
  v.push_back(make("argmax_unsplit_dim", "x=8", {{{8, 16}, P("x")}}, argmax1, false, "P('x')"));
  v.push_back(make("argmax_keepdims", "a=2,b=2", {{{8, 16}, P("a", "b")}}, argmax0_keep, false));
  return v;
}

std::vector<Case> layout_cases() {
  std::vector<Case> v;
  auto reshape_to = [](Shape s) -> Fn {
    return [s](const std::vector<Array>& a) { return std::vector<Array>{reshape(a[0], s)}; };
  };
  // Split dims: the split major dim keeps its split.
  v.push_back(make("reshape_split_minor", "x=2", {{{8, 16}, P("x")}}, reshape_to({8, 4, 4}), true, "P('x')"));
  v.push_back(
      make("reshape_split_split_dim", "x=4", {{{8, 16}, P(None, "x")}}, reshape_to({8, 4, 4}), true, "P(None, 'x')"));
  v.push_back(make("reshape_split_must_gather", "x=8", {{{8, 16}, P(None, "x")}}, reshape_to({8, 4, 4})));
  // Merges: the major dim keeps its split, a split minor dim is gathered.
  v.push_back(
      make("reshape_merge", "a=2,b=2", {{{4, 4, 16}, P("a", None, "b")}}, reshape_to({16, 16}), true, "P('a', 'b')"));
  v.push_back(make("reshape_merge_minor_gathers", "a=2,b=2", {{{4, 4, 16}, P("a", "b")}}, reshape_to({16, 16})));
  v.push_back(make("reshape_flatten", "x=8", {{{16, 8}, P("x")}}, reshape_to({128}), true, "P('x')"));
  v.push_back(make("reshape_unflatten", "x=4", {{{128}, P("x")}}, reshape_to({16, 8}), true, "P('x')"));
  v.push_back(make("reshape_unit_dims", "a=4,b=2", {{{8, 1, 16}, P("a", None, "b")}}, reshape_to({8, 16, 1})));
  Fn t2 = [](const std::vector<Array>& a) { return std::vector<Array>{a[0].T()}; };
  Fn t3 = [](const std::vector<Array>& a) { return std::vector<Array>{transpose(a[0], {2, 0, 1})}; };
  v.push_back(make("transpose", "x=4", {{{8, 16}, P("x")}}, t2, true, "P(None, 'x')"));
  v.push_back(make("transpose", "a=2,b=4", {{{8, 16}, P("a", "b")}}, t2, true, "P('b', 'a')"));
  v.push_back(make("transpose3", "a=2,b=2", {{{4, 8, 6}, P("a", None, "b")}}, t3, true, "P('b', 'a')"));
  auto bcast = [](Shape s) -> Fn {
    return [s](const std::vector<Array>& a) { return std::vector<Array>{broadcast_to(a[0], s)}; };
  };
  v.push_back(make("broadcast_row", "x=4", {{{1, 16}, P(None, "x")}}, bcast({8, 16}), true, "P(None, 'x')"));
  v.push_back(make("broadcast_rank", "x=8", {{{16}, P("x")}}, bcast({4, 16}), true, "P(None, 'x')"));
  v.push_back(make("broadcast_rank3", "a=2,b=2", {{{8, 1}, P("a")}, {{1}, P()}}, [](const std::vector<Array>& a) {
    return std::vector<Array>{broadcast_to(a[0], {4, 8, 6})};
  }));
  auto slicer = [](std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step) -> Fn {
    return
        [start, stop, step](const std::vector<Array>& a) { return std::vector<Array>{slice(a[0], start, stop, step)}; };
  };
  // slice: whole range on the split dim (local), part of the split dim (gathered),
  // strided; their gradients are slice_pad.
  v.push_back(make("slice_whole_split", "x=4", {{{8, 16}, P("x")}}, slicer({0, 3}, {8, 11}, {1, 1}), true, "P('x')"));
  v.push_back(make("slice_partial_split", "x=4", {{{8, 16}, P("x")}}, slicer({2, 0}, {6, 16}, {1, 1})));
  v.push_back(make("slice_step", "a=2,b=2", {{{8, 16}, P("a", "b")}}, slicer({0, 1}, {8, 16}, {1, 2})));
  v.push_back(make("slice_both", "a=2,b=4", {{{8, 16}, P("b", "a")}}, slicer({1, 0}, {7, 16}, {2, 1})));
  auto concat = [](int axis) -> Fn {
    return [axis](const std::vector<Array>& a) { return std::vector<Array>{concatenate({a[0], a[1]}, axis)}; };
  };
  v.push_back(make("concat_unsplit_axis", "x=4", {{{8, 16}, P("x")}, {{8, 8}, P("x")}}, concat(1), true, "P('x')"));
  v.push_back(make("concat_split_axis", "x=2", {{{8, 16}, P("x")}, {{4, 16}, P("x")}}, concat(0)));
  v.push_back(make("concat_mixed", "a=2,b=2", {{{8, 16}, P("a", "b")}, {{8, 16}, P("b")}}, concat(0)));
  v.push_back(
      make("concat_one_split", "x=8", {{{8, 16}, P(None, "x")}, {{8, 16}, P()}}, concat(0), true, "P(None, 'x')"));
  return v;
}

}  // namespace tessera::sharding_cases
