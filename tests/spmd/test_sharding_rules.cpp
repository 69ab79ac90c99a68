// Every primitive family's sharding rule, checked end to end: the op (and, where it
// is differentiable, value_and_grad of a scalar function of it) runs under jit with
// sharded inputs on 2, 4 and 8 virtual devices, meshes of one and two axes, and must
// equal the unsharded jit result to float32 rounding. One parameterized case per
// (op, mesh, layout), so each shows in ctest's list.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "spmd_test_util.h"
#include "tessera/core/transforms.h"
#include "tessera/ir/primitives/linalg.h"
#include "tessera/ir/primitives/optim.h"

namespace tessera {
namespace {

using spmd::Axes;
using spmd::Mesh;
using spmd::NamedSharding;
using spmd::None;
using spmd::P;
using spmd::PartitionSpec;
using testing::expect_close;
using testing::VirtualDevices;

using Fn = std::function<std::vector<Array>(const std::vector<Array>&)>;

// How a test input's values are drawn.
enum class Gen {
  Float,     // uniform [-1, 1)
  Positive,  // uniform [0.1, 1.1) (second moments, learning rates)
  Index,     // int64 in [0, bound)
  Targets,   // int64 in [0, bound), every 5th one ignore_index (-100)
  Mask,      // bool, ~75% true, the diagonal true (no fully masked row)
  Step,      // int64 scalar 3
};

struct Arg {
  Shape shape;
  PartitionSpec spec;
  Gen gen = Gen::Float;
  int64_t bound = 0;
};

struct Case {
  std::string name;
  std::string mesh;
  std::vector<Arg> args;
  Fn fn;
  bool grad = true;  // also compare value_and_grad of a scalar function of the outputs
  // When set: the layout (Sharding::to_string) output 0 propagates to. Checks a rule
  // keeps a split it can keep instead of gathering.
  std::string layout;
  // When set: the layout cannot be derived and partitioning must throw ShardingError
  // containing this text (rules never guess).
  std::string error;
  // When set: a known partitioner/rule bug; the case is skipped with this text.
  std::string bug;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Array make_arg(const Arg& a, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t n = static_cast<size_t>(numel(a.shape));
  switch (a.gen) {
    case Gen::Float:
      return testing::random_array(a.shape, seed);
    case Gen::Positive: {
      std::uniform_real_distribution<float> u(0.1f, 1.1f);
      std::vector<float> v(n);
      for (float& x : v) x = u(rng);
      return Array::from_vector(v, a.shape);
    }
    case Gen::Index:
    case Gen::Targets: {
      std::uniform_int_distribution<int64_t> u(0, a.bound - 1);
      std::vector<int64_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = a.gen == Gen::Targets && i % 5 == 3 ? -100 : u(rng);
      return Array::from_vector(v, a.shape);
    }
    case Gen::Mask: {
      std::bernoulli_distribution keep(0.75);
      int64_t cols = a.shape.back(), rows = a.shape[a.shape.size() - 2];
      std::vector<uint8_t> v(n);
      for (size_t i = 0; i < n; ++i) {
        int64_t c = static_cast<int64_t>(i) % cols, r = (static_cast<int64_t>(i) / cols) % rows;
        v[i] = r == c || keep(rng) ? 1 : 0;
      }
      return astype(Array::from_vector(v, a.shape), DType::Bool).eval();
    }
    case Gen::Step:
      return Array::from_vector(std::vector<int64_t>{3}, Shape{});
  }
  return Array();
}

// Deterministic non-uniform positive weights of a given shape (so every output
// element gets its own cotangent).
Array weights(const Shape& shape) {
  int64_t n = numel(shape);
  Array i = astype(arange(n), DType::Float32);
  return reshape(sin(i * 0.37) * 0.5 + 1.0, shape);
}

// sum_i sum(w_i * out_i^2) over the floating outputs: no cancellation, so the value
// compares to relative float32 rounding.
Array scalar_of(const std::vector<Array>& outs) {
  Array total;
  for (const Array& o : outs) {
    if (!is_floating(o.dtype())) continue;
    Array f = astype(o, DType::Float32);
    Array term = sum(multiply(weights(f.shape()), square(f)));
    total = total.valid() ? add(total, term) : term;
  }
  return total;
}

void compare(const std::vector<Array>& got, const std::vector<Array>& expected, const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    std::string name = what + " output " + std::to_string(i);
    ASSERT_EQ(got[i].dtype(), expected[i].dtype()) << name;
    if (is_floating(expected[i].dtype())) {
      expect_close(got[i], expected[i], 1e-5, name);
    } else {
      ASSERT_EQ(got[i].shape(), expected[i].shape()) << name;
      EXPECT_EQ(spmd::gather(got[i]).to_vector<int64_t>(), spmd::gather(expected[i]).to_vector<int64_t>()) << name;
    }
  }
}

class ShardingRules : public ::testing::TestWithParam<Case> {};

TEST_P(ShardingRules, ShardedEqualsUnsharded) {
  const Case& c = GetParam();
  // TESSERA_TEST_RUN_BUGS=1 runs the known-bug cases too (to check a fix).
  if (!c.bug.empty() && !std::getenv("TESSERA_TEST_RUN_BUGS")) GTEST_SKIP() << "BUG: " << c.bug;
  Mesh mesh = Mesh::parse(c.mesh);
  VirtualDevices devices(mesh.size());
  std::vector<Array> host, sharded;
  std::vector<int> float_args;
  for (size_t i = 0; i < c.args.size(); ++i) {
    host.push_back(make_arg(c.args[i], 1000 + i));
    sharded.push_back(spmd::device_put(host.back(), NamedSharding(mesh, c.args[i].spec)));
    if (is_floating(host.back().dtype()) && c.args[i].gen != Gen::Positive) float_args.push_back(static_cast<int>(i));
  }

  auto forward = jit(c.fn);
  if (!c.error.empty()) {
    try {
      forward(sharded);
      ADD_FAILURE() << "expected a ShardingError containing '" << c.error << "'";
    } catch (const spmd::ShardingError& e) {
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("with_sharding_constraint"), std::string::npos) << e.what();
    }
    return;
  }
  std::vector<Array> expected = jit(c.fn)(host);
  std::vector<Array> got = forward(sharded);
  compare(got, expected, "forward");
  for (const Array& g : got) ASSERT_NE(spmd::sharding_of(g), nullptr) << "an SPMD output is a sharded array";
  if (!c.layout.empty()) {
    EXPECT_EQ(spmd::sharding_of(got[0])->to_string(), c.layout)
        << forward.lowered(Tree::list({sharded.begin(), sharded.end()})).text();
  }

  if (!c.grad || float_args.empty()) return;
  Fn fn = c.fn;
  auto step = [fn, float_args](const std::vector<Array>& a) {
    auto [value, grads] = value_and_grad([fn](const std::vector<Array>& x) { return scalar_of(fn(x)); }, float_args)(a);
    std::vector<Array> out = {value};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  };
  std::vector<Array> expected_grads = jit(step)(host);
  // Gradients laid out like their inputs (as a training step asks for them): partial
  // sums are reduce-scattered or all-reduced onto the input's layout.
  JitOptions options;
  options.out_shardings.push_back(std::nullopt);
  for (int i : float_args) options.out_shardings.push_back(*spmd::sharding_of(sharded[static_cast<size_t>(i)]));
  auto backward = jit(step, options);
  std::vector<Array> got_grads = backward(sharded);
  for (size_t k = 0; k < float_args.size(); ++k)
    EXPECT_EQ(*spmd::sharding_of(got_grads[k + 1]), *options.out_shardings[k + 1]) << "gradient " << k;
  if (std::getenv("TESSERA_TEST_VERBOSE"))
    std::cout << backward.lowered(Tree::list({sharded.begin(), sharded.end()})).text();
  compare(got_grads, expected_grads, "value_and_grad");
}

// ---- case lists ----------------------------------------------------------------

std::string tag(const PartitionSpec& spec) {
  std::string s;
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    s += d ? "_" : "";
    if (spec.dims[d].empty()) s += "N";
    for (const std::string& a : spec.dims[d]) s += a;
  }
  return s.empty() ? "R" : s;
}

std::string mesh_tag(const std::string& mesh) {
  std::string s;
  for (char ch : mesh)
    if (std::isalnum(static_cast<unsigned char>(ch))) s += ch;
  return s;
}

// Name: op + mesh + every input's layout.
Case make(const std::string& op, const std::string& mesh, std::vector<Arg> args, Fn fn, bool grad = true,
          std::string layout = "") {
  std::string name = op + "__" + mesh_tag(mesh);
  for (const Arg& a : args) name += "__" + tag(a.spec);
  return Case{name, mesh, std::move(args), std::move(fn), grad, std::move(layout), "", ""};
}

Fn unary(Array (*f)(const Array&)) {
  return [f](const std::vector<Array>& a) { return std::vector<Array>{f(a[0])}; };
}

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

// matmul_op(A, B, trans_a, trans_b) with A = [M, K] (or [K, M]) and B = [K, N] (or
// [N, K]): every assignment of the mesh axes to M, K (of A) and K, N (of B).
std::vector<Case> matmul_cases() {
  std::vector<Case> v;
  const int64_t M = 16, K = 32, N = 24;
  auto mm = [](bool ta, bool tb) -> Fn {
    return [ta, tb](const std::vector<Array>& a) { return std::vector<Array>{matmul_op(a[0], a[1], ta, tb)}; };
  };
  // A spec from (m axes, k axes) respecting the transpose flag.
  auto spec2 = [](const Axes& first_logical, const Axes& second_logical, bool trans) {
    return trans ? P(second_logical, first_logical) : P(first_logical, second_logical);
  };
  // One-axis mesh: each of M, K(A), K(B), N split on x or not (an operand splits at most one dim).
  std::vector<std::pair<Axes, Axes>> one = {{{}, {}}, {{"x"}, {}}, {{}, {"x"}}};
  for (int t = 0; t < 4; ++t) {
    bool ta = t & 1, tb = t & 2;
    std::string flags = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
    for (const auto& [am, ak] : one)
      for (const auto& [bk, bn] : one) {
        if (am.empty() && ak.empty() && bk.empty() && bn.empty()) continue;
        Shape sa = ta ? Shape{K, M} : Shape{M, K};
        Shape sb = tb ? Shape{N, K} : Shape{K, N};
        v.push_back(make("matmul_" + flags, "x=4", {{sa, spec2(am, ak, ta)}, {sb, spec2(bk, bn, tb)}}, mm(ta, tb)));
      }
  }
  // Two-axis mesh: every assignment of {a, b} to (M, K) and (K, N), including both on one dim.
  std::vector<std::pair<Axes, Axes>> two = {{{}, {}},       {{"a"}, {}},      {{"b"}, {}},
                                            {{}, {"a"}},    {{}, {"b"}},      {{"a"}, {"b"}},
                                            {{"b"}, {"a"}}, {{"a", "b"}, {}}, {{}, {"a", "b"}}};
  for (const auto& [am, ak] : two)
    for (const auto& [bk, bn] : two) {
      if (am.empty() && ak.empty() && bk.empty() && bn.empty()) continue;
      v.push_back(make("matmul_nn", "a=2,b=2", {{{M, K}, P(am, ak)}, {{K, N}, P(bk, bn)}}, mm(false, false)));
    }
  // Both operands transposed, every assignment on a two-axis mesh of 8 devices.
  for (const auto& [am, ak] : two)
    for (const auto& [bk, bn] : two) {
      if (am.empty() && ak.empty() && bk.empty() && bn.empty()) continue;
      v.push_back(make("matmul_tt", "a=4,b=2", {{{K, M}, P(ak, am)}, {{N, K}, P(bn, bk)}}, mm(true, true)));
    }
  // Transposed operands on a two-axis mesh of 8 devices.
  for (int t = 1; t < 3; ++t) {
    bool ta = t & 1, tb = t & 2;
    std::string flags = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
    for (const auto& [am, ak, bk, bn] : std::vector<std::tuple<Axes, Axes, Axes, Axes>>{
             {{"a"}, {"b"}, {"b"}, {}}, {{"a"}, {}, {}, {"b"}}, {{}, {"a"}, {"b"}, {}}, {{"b"}, {"a"}, {}, {"a"}}}) {
      Shape sa = ta ? Shape{K, M} : Shape{M, K};
      Shape sb = tb ? Shape{N, K} : Shape{K, N};
      v.push_back(make("matmul_" + flags, "a=2,b=4", {{sa, spec2(am, ak, ta)}, {sb, spec2(bk, bn, tb)}}, mm(ta, tb)));
    }
  }
  // Batched [B, M, K] @ [K, N] and [B, M, K] @ [B, K, N].
  const int64_t B = 4;
  Fn plain = [](const std::vector<Array>& a) { return std::vector<Array>{matmul(a[0], a[1])}; };
  std::vector<PartitionSpec> lhs3 = {
      P("a"), P("a", "b"), P("a", None, "b"), P(None, "a", "b"), P(Axes{"a", "b"}), P("b", None, "a")};
  std::vector<PartitionSpec> rhs2 = {P(), P("b"), P(None, "b"), P("a"), P("b", "a")};
  for (const auto& l : lhs3)
    for (const auto& r : rhs2) v.push_back(make("bmm_shared_rhs", "a=2,b=2", {{{B, M, K}, l}, {{K, N}, r}}, plain));
  std::vector<PartitionSpec> rhs3 = {P("a"), P("a", "b"),       P("a", None, "b"), P(None, "b"),
                                     P("b"), P(Axes{"a", "b"}), P(None, "a")};
  for (const auto& l : lhs3)
    for (const auto& r : rhs3) {
      Case c = make("bmm", "a=2,b=2", {{{B, M, K}, l}, {{B, K, N}, r}}, plain);
      // A's batch on b with a on its K, B's batch on a: axis a splits K of one operand
      // and the batch of the other, which the rule refuses to guess about.
      const Axes& lb = l.dims[0];
      const Axes& rb = r.dims[0];
      if (!lb.empty() && !rb.empty() && lb[0] != rb[0]) c.error = "split batch dimension 0 differently";
      v.push_back(c);
    }
  v.push_back(make("bmm", "x=8", {{{8, M, K}, P("x")}, {{8, K, N}, P("x")}}, plain, true, "P('x')"));
  v.push_back(make("bmm_nt", "a=4,b=2", {{{B, M, K}, P("a", None, "b")}, {{B, N, K}, P("a", None, "b")}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{matmul_op(a[0], a[1], false, true)}; }));
  return v;
}

std::vector<Case> nn_cases() {
  std::vector<Case> v;
  Fn sm = [](const std::vector<Array>& a) { return std::vector<Array>{softmax(a[0])}; };
  Fn lsm = [](const std::vector<Array>& a) { return std::vector<Array>{log_softmax(a[0])}; };
  Fn sm0 = [](const std::vector<Array>& a) { return std::vector<Array>{softmax(a[0], 0)}; };
  v.push_back(make("softmax_rows", "x=4", {{{8, 16}, P("x")}}, sm, true, "P('x')"));
  v.push_back(make("softmax_normalized_dim", "x=2", {{{8, 16}, P(None, "x")}}, sm));
  v.push_back(make("softmax_rank3", "a=2,b=4", {{{4, 8, 16}, P("a", "b")}}, sm, true, "P('a', 'b')"));
  v.push_back(make("softmax_axis0", "x=8", {{{8, 16}, P("x")}}, sm0));
  v.push_back(make("log_softmax_rows", "x=8", {{{8, 16}, P("x")}}, lsm, true, "P('x')"));
  v.push_back(make("log_softmax_both", "a=2,b=2", {{{8, 16}, P("a", "b")}}, lsm));

  Fn ln = [](const std::vector<Array>& a) { return std::vector<Array>{layer_norm(a[0], a[1], a[2])}; };
  Fn rms = [](const std::vector<Array>& a) { return std::vector<Array>{rms_norm(a[0], a[1])}; };
  Fn ln_plain = [](const std::vector<Array>& a) { return std::vector<Array>{layer_norm(a[0])}; };
  v.push_back(make("layer_norm_rows", "x=4", {{{8, 16}, P("x")}, {{16}, P()}, {{16}, P()}}, ln, true, "P('x')"));
  v.push_back(make("layer_norm_features", "x=2", {{{8, 16}, P(None, "x")}, {{16}, P("x")}, {{16}, P("x")}}, ln));
  v.push_back(make("layer_norm_rank3", "a=2,b=2", {{{4, 8, 16}, P("a", "b")}, {{16}, P("b")}, {{16}, P()}}, ln, true,
                   "P('a', 'b')"));
  v.push_back(make("layer_norm_no_params", "x=8", {{{8, 16}, P("x")}}, ln_plain));
  v.push_back(make("rms_norm_rows", "x=8", {{{16, 16}, P("x")}, {{16}, P()}}, rms, true, "P('x')"));
  v.push_back(make("rms_norm_rank3", "a=4,b=2", {{{4, 8, 16}, P("a", "b")}, {{16}, P("a")}}, rms));

  // Attention: q [B, H, T, D], k/v [B, Hkv, S, D].
  auto attn = [](bool causal) -> Fn {
    return [causal](const std::vector<Array>& a) {
      return std::vector<Array>{scaled_dot_product_attention(a[0], a[1], a[2], causal)};
    };
  };
  Fn attn_mask = [](const std::vector<Array>& a) {
    return std::vector<Array>{scaled_dot_product_attention(a[0], a[1], a[2], false, a[3])};
  };
  auto qkv = [](Shape q, Shape kv, const PartitionSpec& sq, const PartitionSpec& skv) {
    return std::vector<Arg>{{q, sq}, {kv, skv}, {kv, skv}};
  };
  v.push_back(make("attention_causal_batch", "x=2", qkv({2, 4, 8, 8}, {2, 4, 8, 8}, P("x"), P("x")), attn(true), true,
                   "P('x')"));
  v.push_back(make("attention_heads", "x=4", qkv({2, 4, 8, 8}, {2, 4, 8, 8}, P(None, "x"), P(None, "x")), attn(true),
                   true, "P(None, 'x')"));
  v.push_back(make("attention_gqa_heads", "x=4", qkv({2, 8, 8, 8}, {2, 4, 8, 8}, P(None, "x"), P(None, "x")),
                   attn(true), true, "P(None, 'x')"));
  v.push_back(
      make("attention_gqa_heads_indivisible", "x=4", qkv({2, 8, 8, 8}, {2, 2, 8, 8}, P(None, "x"), P()), attn(true)));
  v.push_back(make("attention_gqa_batch_heads", "a=2,b=2", qkv({2, 4, 8, 8}, {2, 2, 8, 8}, P("a", "b"), P("a", "b")),
                   attn(false), true, "P('a', 'b')"));
  v.push_back(make("attention_seq_split", "x=2",
                   qkv({2, 4, 8, 8}, {2, 2, 16, 8}, P(None, None, "x"), P(None, None, "x")), attn(false)));
  v.push_back(make("attention_q_only_split", "x=8", qkv({2, 8, 8, 8}, {2, 8, 8, 8}, P(None, "x"), P()), attn(true)));
  v.push_back(make("attention_mask", "a=4,b=2",
                   {{{4, 4, 8, 8}, P("a", "b")},
                    {{4, 2, 8, 8}, P("a", "b")},
                    {{4, 2, 8, 8}, P("a", "b")},
                    {{4, 1, 8, 8}, P("a"), Gen::Mask}},
                   attn_mask));

  // Cross-entropy: logits [N, V] (or [B, T, V]), integer targets (some ignored).
  auto ce = [](Reduction r) -> Fn {
    return [r](const std::vector<Array>& a) { return std::vector<Array>{cross_entropy(a[0], a[1], -100, r)}; };
  };
  v.push_back(
      make("cross_entropy_rows", "x=4", {{{16, 32}, P("x")}, {{16}, P("x"), Gen::Targets, 32}}, ce(Reduction::Mean)));
  v.push_back(make("cross_entropy_rows_none", "x=8", {{{16, 32}, P("x")}, {{16}, P("x"), Gen::Targets, 32}},
                   ce(Reduction::None), true, "P('x')"));
  v.push_back(make("cross_entropy_vocab", "x=4", {{{16, 32}, P(None, "x")}, {{16}, P(), Gen::Targets, 32}},
                   ce(Reduction::Sum)));
  v.push_back(make("cross_entropy_rows_vocab", "a=2,b=2", {{{16, 32}, P("a", "b")}, {{16}, P("a"), Gen::Targets, 32}},
                   ce(Reduction::Mean)));
  v.push_back(make("cross_entropy_targets_split", "x=2", {{{16, 32}, P()}, {{16}, P("x"), Gen::Targets, 32}},
                   ce(Reduction::None)));
  v.push_back(make("cross_entropy_rank3", "a=2,b=4",
                   {{{4, 8, 32}, P("a", "b")}, {{4, 8}, P("a", "b"), Gen::Targets, 32}}, ce(Reduction::Mean)));
  return v;
}

std::vector<Case> indexing_cases() {
  std::vector<Case> v;
  // take(table [V, E], ids [B, T], 0): the embedding lookup; its gradient is scatter_add.
  Fn embed = [](const std::vector<Array>& a) { return std::vector<Array>{take(a[0], a[1], 0)}; };
  v.push_back(make("take_embed_dim", "x=4", {{{32, 16}, P(None, "x")}, {{4, 8}, P(), Gen::Index, 32}}, embed, true,
                   "P(None, None, 'x')"));
  v.push_back(make("take_indices", "x=4", {{{32, 16}, P()}, {{4, 8}, P("x"), Gen::Index, 32}}, embed, true, "P('x')"));
  v.push_back(make("take_both", "a=2,b=2", {{{32, 16}, P(None, "b")}, {{4, 8}, P("a"), Gen::Index, 32}}, embed, true,
                   "P('a', None, 'b')"));
  v.push_back(make("take_vocab_split", "x=8", {{{32, 16}, P("x")}, {{4, 8}, P(None, "x"), Gen::Index, 32}}, embed));
  v.push_back(make("take_same_axis", "x=2", {{{32, 16}, P(None, "x")}, {{4, 8}, P(None, "x"), Gen::Index, 32}}, embed));
  // The lookup's cotangent arrives split on the embed dim (a larger operand downstream
  // wins the layout) while the ids are split on the same axis: scatter_add gathers the
  // ids' split (an axis may not both split the table and be a partial sum).
  {
    Case c = make("take_cotangent_embed_split", "x=2",
                  {{{32, 16}, P()}, {{4, 8}, P(None, "x"), Gen::Index, 32}, {{2, 4, 8, 16}, P(None, None, None, "x")}},
                  [](const std::vector<Array>& a) { return std::vector<Array>{multiply(take(a[0], a[1], 0), a[2])}; });
    v.push_back(c);
  }
  v.push_back(
      make("take_seq_indices", "a=2,b=4", {{{32, 16}, P(None, "a")}, {{4, 8}, P(None, "b"), Gen::Index, 32}}, embed));
  v.push_back(make("take_axis1", "a=2,b=2", {{{8, 32}, P("a", "b")}, {{6}, P(), Gen::Index, 32}},
                   [](const std::vector<Array>& a) { return std::vector<Array>{take(a[0], a[1], 1)}; }));
  Fn along1 = [](const std::vector<Array>& a) { return std::vector<Array>{take_along_axis(a[0], a[1], 1)}; };
  Fn along0 = [](const std::vector<Array>& a) { return std::vector<Array>{take_along_axis(a[0], a[1], 0)}; };
  v.push_back(
      make("take_along_rows", "x=4", {{{8, 16}, P("x")}, {{8, 3}, P("x"), Gen::Index, 16}}, along1, true, "P('x')"));
  v.push_back(make("take_along_split_axis", "x=2", {{{8, 16}, P(None, "x")}, {{8, 3}, P(), Gen::Index, 16}}, along1));
  v.push_back(
      make("take_along_axis0", "a=2,b=4", {{{8, 16}, P("a", "b")}, {{3, 16}, P(None, "b"), Gen::Index, 8}}, along0));
  v.push_back(make("take_along_idx_only", "x=8", {{{8, 16}, P()}, {{8, 4}, P("x"), Gen::Index, 16}}, along1));

  // adamw_update: p, g, m, v (v >= 0), static and dynamic (lr and step as arrays).
  Fn adamw_static = [](const std::vector<Array>& a) {
    AdamWConfig config;
    config.lr = 0.01;
    config.weight_decay = 0.1;
    config.step = 3;
    return adamw_update(a[0], a[1], a[2], a[3], config);
  };
  Fn adamw_dynamic = [](const std::vector<Array>& a) {
    AdamWConfig config;
    config.weight_decay = 0.1;
    return adamw_update(a[0], a[1], a[2], a[3], a[4], a[5], config);
  };
  auto state = [](const PartitionSpec& p, const PartitionSpec& g) {
    return std::vector<Arg>{{{16, 8}, p}, {{16, 8}, g}, {{16, 8}, p}, {{16, 8}, p, Gen::Positive}};
  };
  v.push_back(make("adamw", "x=4", state(P("x"), P("x")), adamw_static, false, "P('x')"));
  v.push_back(make("adamw_grad_other_layout", "x=8", state(P("x"), P(None, "x")), adamw_static, false, "P('x')"));
  v.push_back(make("adamw_grad_replicated", "a=2,b=2", state(P("a", "b"), P()), adamw_static, false, "P('a', 'b')"));
  {
    std::vector<Arg> args = state(P("b", "a"), P("b"));
    args.push_back({{}, P(), Gen::Positive});
    args.push_back({{}, P(), Gen::Step});
    v.push_back(make("adamw_dynamic", "a=2,b=4", args, adamw_dynamic, false, "P('b', 'a')"));
  }
  // The FSDP update: the gradient is a partial sum (a matmul over the split batch)
  // reduce-scattered onto the parameter's layout.
  v.push_back(make(
      "adamw_partial_grad", "x=4",
      {{{16, 8}, P("x")}, {{32, 16}, P("x")}, {{32, 8}, P("x")}, {{16, 8}, P("x")}, {{16, 8}, P("x"), Gen::Positive}},
      [](const std::vector<Array>& a) {
        AdamWConfig config;
        config.lr = 0.01;
        Array g = matmul_op(a[1], a[2], true, false);  // [16, 8], partial over x
        return adamw_update(a[0], g, a[3], a[4], config);
      },
      false, "P('x')"));
  return v;
}

std::vector<Case> all_cases() {
  std::vector<Case> all;
  for (auto list : {elementwise_cases(), partial_cases(), reduce_cases(), layout_cases(), matmul_cases(), nn_cases(),
                    indexing_cases()})
    all.insert(all.end(), list.begin(), list.end());
  return all;
}

INSTANTIATE_TEST_SUITE_P(Spmd, ShardingRules, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
