// Every primitive family's sharding rule, checked end to end: the op (and, where it
// is differentiable, value_and_grad of a scalar function of it) runs under jit with
// sharded inputs on 2, 4 and 8 virtual devices, meshes of one and two axes, and must
// equal the unsharded jit result to float32 rounding. One parameterized case per
// (op, mesh, layout), so each shows in ctest's list. The cases:
// test_sharding_rules_cases_*.cpp.
#include "sharding_rule_cases.h"

namespace tessera::sharding_cases {
namespace {

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
}  // namespace tessera::sharding_cases
