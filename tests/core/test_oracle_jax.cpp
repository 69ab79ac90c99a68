// tessera vs JAX (an external reference) on the core ops, in float64.
//
// tests/oracles/jax_core.py evaluated each case with jax 0.4.30 and wrote the
// inputs, the output and the gradients of loss = sum(output * ct) to
// tests/oracles/goldens/jax_core.json (17 significant digits). Here each case is
// rebuilt from tessera ops: the output must match, and value_and_grad of the same
// loss must match JAX's gradients. The hvp_* cases output grad f(x), so their
// gradients are grad-of-grad (Hessian-vector products).
//
// Regenerate / check the golden is current: tests/oracles/run_oracle.sh jax_core
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "test_util.h"

#ifndef TESSERA_SOURCE_DIR
#error "TESSERA_SOURCE_DIR must name the source tree (CMakeLists.txt sets it for test_core)"
#endif

namespace tessera::test {
namespace {

using nlohmann::json;
using Inputs = std::map<std::string, Array>;
using CaseFn = std::function<Array(const Inputs&, const json& params)>;

// Both sides compute in float64, so the differences are rounding in different
// evaluation orders (BLAS blocking, fused kernels vs jnp compositions): measured
// max |tessera - JAX| / max(1, |JAX|) is 1.6e-15 over all cases (run with
// TESSERA_ORACLE_VERBOSE=1); these bounds leave ~60x headroom for other BLAS builds.
constexpr double kRtol = 1e-12;
constexpr double kAtol = 1e-13;

const char* const kGoldenPath = TESSERA_SOURCE_DIR "/tests/oracles/goldens/jax_core.json";

// The golden, parsed once; a missing or unreadable file fails every case.
const json& golden() {
  static const json parsed = [] {
    std::ifstream f(kGoldenPath);
    if (!f) return json();
    return json::parse(f, nullptr, /*allow_exceptions=*/false);
  }();
  return parsed;
}

Shape shape_of(const json& t) { return t.at("shape").get<Shape>(); }

Array array_of(const json& t) {
  if (t.value("dtype", "float64") == "int64")
    return Array::from_vector<int64_t>(t.at("data").get<std::vector<int64_t>>(), shape_of(t));
  return Array::from_vector<double>(t.at("data").get<std::vector<double>>(), shape_of(t));
}

std::vector<int> ints_of(const json& params, const char* key) { return params.at(key).get<std::vector<int>>(); }

// ---- each golden case as tessera ops ----
Array unary(const Inputs& in, Array (*op)(const Array&)) { return op(in.at("x")); }

const std::map<std::string, CaseFn>& case_fns() {
  static const std::map<std::string, CaseFn> fns = {
      {"gelu_tanh", [](const Inputs& in, const json&) { return gelu(in.at("x"), true); }},
      {"gelu_erf", [](const Inputs& in, const json&) { return gelu(in.at("x"), false); }},
      {"silu", [](const Inputs& in, const json&) { return unary(in, silu); }},
      {"sigmoid", [](const Inputs& in, const json&) { return unary(in, sigmoid); }},
      {"tanh", [](const Inputs& in, const json&) { return unary(in, tanh); }},
      {"erf", [](const Inputs& in, const json&) { return unary(in, erf); }},
      {"log1p", [](const Inputs& in, const json&) { return unary(in, log1p); }},
      {"softmax_last", [](const Inputs& in, const json& p) { return softmax(in.at("x"), p.at("axis").get<int>()); }},
      {"softmax_axis1", [](const Inputs& in, const json& p) { return softmax(in.at("x"), p.at("axis").get<int>()); }},
      {"log_softmax_last",
       [](const Inputs& in, const json& p) { return log_softmax(in.at("x"), p.at("axis").get<int>()); }},
      {"logsumexp_axis1",
       [](const Inputs& in, const json& p) {
         return logsumexp(in.at("x"), ints_of(p, "axes"), p.at("keepdims").get<bool>());
       }},
      {"logsumexp_axes02_keepdims",
       [](const Inputs& in, const json& p) {
         return logsumexp(in.at("x"), ints_of(p, "axes"), p.at("keepdims").get<bool>());
       }},
      {"layer_norm",
       [](const Inputs& in, const json& p) {
         return layer_norm(in.at("x"), in.at("w"), in.at("b"), p.at("eps").get<double>());
       }},
      {"rms_norm",
       [](const Inputs& in, const json& p) { return rms_norm(in.at("x"), in.at("w"), p.at("eps").get<double>()); }},
      {"matmul_broadcast_batch", [](const Inputs& in, const json&) { return matmul(in.at("a"), in.at("b")); }},
      {"dot_general",
       [](const Inputs& in, const json& p) {
         return dot_general(in.at("a"), in.at("b"), ints_of(p, "a_contract"), ints_of(p, "b_contract"),
                            ints_of(p, "a_batch"), ints_of(p, "b_batch"));
       }},
      {"attention_causal_gqa",
       [](const Inputs& in, const json& p) {
         return scaled_dot_product_attention(in.at("q"), in.at("k"), in.at("v"), p.at("causal").get<bool>());
       }},
      {"attention_causal_gqa_t3_s6",
       [](const Inputs& in, const json& p) {
         return scaled_dot_product_attention(in.at("q"), in.at("k"), in.at("v"), p.at("causal").get<bool>());
       }},
      {"cross_entropy_mean_ignore",
       [](const Inputs& in, const json& p) {
         return cross_entropy(in.at("logits"), in.at("targets"), p.at("ignore_index").get<int64_t>(), Reduction::Mean);
       }},
      // out = grad f(x): the loss gradient below is then a Hessian-vector product.
      {"hvp_tanh_cubed",
       [](const Inputs& in, const json&) {
         auto f = [](const Array& x) {
           Array t = tanh(x);
           return sum(power(t, scalar_like(3.0, t)));
         };
         return grad(std::function<Array(const Array&)>(f))(in.at("x"));
       }},
      {"hvp_softmax_dot",
       [](const Inputs& in, const json& p) {
         const Array& x = in.at("x");
         Array w = Array::from_vector<double>(p.at("weights").get<std::vector<double>>(), x.shape());
         auto f = [w](const Array& z) { return sum(softmax(z, -1) * w); };
         return grad(std::function<Array(const Array&)>(f))(x);
       }},
  };
  return fns;
}

// ---- comparison ----
std::string index_str(int64_t flat, const Shape& shape) {
  std::string s = "[";
  auto idx = unravel(flat, shape);
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? "," : "") + std::to_string(idx[d]);
  return s + "]";
}

// |got - want| <= atol + rtol |want| elementwise; the message names the case, the
// tensor and the (multi-)index of the first mismatches.
::testing::AssertionResult matches(const std::string& what, const Array& got, const json& want) {
  Shape shape = shape_of(want);
  if (got.shape() != shape)
    return ::testing::AssertionFailure() << what << ": shape " << to_string(got.shape()) << ", JAX has "
                                         << to_string(shape);
  if (got.dtype() != DType::Float64)
    return ::testing::AssertionFailure() << what << ": dtype " << type_string(got) << ", expected float64";
  auto g = got.to_vector<double>();
  auto w = want.at("data").get<std::vector<double>>();
  std::ostringstream msg;
  int bad = 0;
  double worst_rel = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    double err = std::abs(g[i] - w[i]);
    if (std::isfinite(g[i]) && err <= kAtol + kRtol * std::abs(w[i])) continue;
    if (bad < 6)
      msg << "\n  " << what << index_str(static_cast<int64_t>(i), shape) << ": tessera " << std::setprecision(17)
          << g[i] << ", JAX " << w[i] << " (abs diff " << std::setprecision(3) << err << ")";
    worst_rel = std::max(worst_rel, err / std::max(std::abs(w[i]), 1e-300));
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream head;
  head << what << ": " << bad << " of " << w.size() << " elements differ from JAX (rtol " << kRtol << ", atol " << kAtol
       << ", worst rel diff " << std::setprecision(3) << worst_rel << "):";
  return ::testing::AssertionFailure() << head.str() << msg.str();
}

// Largest |got - want| / max(|want|, 1) over a tensor, for the verbose summary.
double max_err(const Array& got, const json& want) {
  auto g = got.to_vector<double>();
  auto w = want.at("data").get<std::vector<double>>();
  double m = 0;
  for (size_t i = 0; i < w.size() && i < g.size(); ++i)
    m = std::max(m, std::abs(g[i] - w[i]) / std::max(1.0, std::abs(w[i])));
  return m;
}

const json* find_case(const std::string& name) {
  const json& gold = golden();
  if (!gold.is_object() || !gold.contains("cases")) return nullptr;
  for (const auto& c : gold.at("cases"))
    if (c.at("name") == name) return &c;
  return nullptr;
}

TEST(OracleJax, GoldenFileIsPresentAndCoveredByTests) {
  const json& gold = golden();
  ASSERT_TRUE(gold.is_object() && gold.contains("cases"))
      << "cannot read " << kGoldenPath << " (missing or not JSON); regenerate it with "
      << "tests/oracles/run_oracle.sh jax_core";
  EXPECT_EQ(gold.value("generator", ""), "tests/oracles/jax_core.py");
  std::set<std::string> seen;
  for (const auto& c : gold.at("cases")) {
    std::string name = c.at("name");
    EXPECT_TRUE(seen.insert(name).second) << "duplicate golden case " << name;
    EXPECT_TRUE(case_fns().count(name)) << "golden case " << name << " has no tessera version in this test";
  }
  for (const auto& [name, fn] : case_fns()) EXPECT_TRUE(seen.count(name)) << "case " << name << " is not in the golden";
}

class OracleJaxCase : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleJaxCase, OutputAndGradientsMatch) {
  const std::string name = GetParam();
  const json* c = find_case(name);
  ASSERT_NE(c, nullptr) << "case " << name << " missing from " << kGoldenPath;
  const json& params = c->at("params");
  const CaseFn& fn = case_fns().at(name);

  Inputs fixed;  // inputs not differentiated: integer targets
  std::vector<std::string> diff = c->at("differentiate").get<std::vector<std::string>>();
  std::vector<Array> primals;
  for (const auto& [key, t] : c->at("inputs").items()) {
    if (key == "ct") continue;
    bool differentiated = std::find(diff.begin(), diff.end(), key) != diff.end();
    EXPECT_EQ(differentiated, t.value("dtype", "float64") == "float64")
        << name << ": input " << key << " should be differentiated iff it is float64";
    if (!differentiated) fixed.emplace(key, array_of(t));
  }
  for (const auto& key : diff) primals.push_back(array_of(c->at("inputs").at(key)));
  const Array ct = array_of(c->at("inputs").at("ct"));

  auto with_fixed = [fixed, diff](const std::vector<Array>& xs) {
    Inputs in = fixed;
    for (size_t i = 0; i < diff.size(); ++i) in.emplace(diff[i], xs[i]);
    return in;
  };

  Array out = fn(with_fixed(primals), params);
  EXPECT_TRUE(matches(name + " output", out, c->at("output")));

  auto loss = [&](const std::vector<Array>& xs) { return sum(fn(with_fixed(xs), params) * ct); };
  auto [value, grads] = value_and_grad(ScalarFn(loss))(primals);
  ASSERT_EQ(grads.size(), diff.size()) << name;
  for (size_t i = 0; i < diff.size(); ++i) {
    const json& want = c->at("grads").at(diff[i]);
    EXPECT_TRUE(matches(name + " grad " + diff[i], grads[i], want));
  }
  if (std::getenv("TESSERA_ORACLE_VERBOSE") != nullptr) {
    std::ostringstream s;
    s << std::setprecision(2) << name << ": max |tessera - JAX| / max(1, |JAX|): output "
      << max_err(out, c->at("output"));
    for (size_t i = 0; i < diff.size(); ++i)
      s << ", grad " << diff[i] << " " << max_err(grads[i], c->at("grads").at(diff[i]));
    std::printf("%s\n", s.str().c_str());
  }
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const auto& [name, fn] : case_fns()) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Golden, OracleJaxCase, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace tessera::test
