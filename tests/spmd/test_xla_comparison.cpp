// tessera's partitioner against XLA's: the programs of bench/spmd/xla_collectives.py
// (a parallel matmul and an MLP layer's forward + backward under data, fully sharded
// and tensor parallelism) are built with the same layouts and lowered; the bytes each
// device sends in tessera's collectives must not exceed what XLA (JAX 0.10.2, 8 CPU
// devices) sends, read from bench/spmd/xla_collectives.json. Each case prints the two
// programs' collectives side by side (docs/spmd.md, "tessera vs XLA").
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "spmd_test_util.h"
#include "tessera/core/transforms.h"
#include "tessera/spmd/spmd_executable.h"

namespace tessera {
namespace {

using spmd::Mesh;
using spmd::None;
using spmd::P;
using spmd::PartitionSpec;
using spmd::Sharding;
using testing::VirtualDevices;

const nlohmann::json& xla_cases() {
  static const nlohmann::json cases = [] {
    std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/bench/spmd/xla_collectives.json");
    if (!in) throw std::runtime_error("cannot open bench/spmd/xla_collectives.json");
    nlohmann::json doc = nlohmann::json::parse(in);
    return doc.at("cases");
  }();
  return cases;
}

// One lowered program: the spec of every argument and output, the function, and
// the global argument types (placeholders: lowering never reads values, so the
// 256 MiB matrix of the matmul case is never allocated).
struct Program {
  Mesh mesh;
  std::vector<Array> args;
  std::vector<PartitionSpec> in, out;
  std::vector<int> out_ranks;
  std::vector<std::string> in_names, out_names;  // as in the JSON
  bool run = false;                              // small enough to also run (8192^2 is only lowered)
  std::function<std::vector<Array>(const std::vector<Array>&)> fn;
};

Program parallel_matmul(const PartitionSpec& out) {
  Program p;
  p.mesh = Mesh::parse("data=2,model=4");
  p.args = {Array::placeholder({8192, 8192}, DType::Float32)};
  p.in = {P("data", "model")};
  p.out = {out};
  p.out_ranks = {2};
  p.in_names = {"x"};
  p.out_names = {"y"};
  p.fn = [](const std::vector<Array>& a) { return std::vector<Array>{matmul(a[0], a[0].T())}; };
  return p;
}

// loss = mean((gelu_tanh(x @ w1 + b1) @ w2 + b2)^2); value_and_grad wrt w1, b1, w2, b2.
// Arguments (w1, b1, w2, b2, x) as the JAX program's (params, x); outputs (loss,
// grad_w1, grad_b1, grad_w2, grad_b2): loss replicated, grads laid out like params.
Program mlp(const std::string& axis, const std::vector<PartitionSpec>& param_specs, const PartitionSpec& x_spec) {
  Program p;
  p.mesh = Mesh::parse(axis + "=8");
  p.args = {Array::placeholder({512, 2048}, DType::Float32), Array::placeholder({2048}, DType::Float32),
            Array::placeholder({2048, 512}, DType::Float32), Array::placeholder({512}, DType::Float32),
            Array::placeholder({256, 512}, DType::Float32)};
  p.in = param_specs;
  p.in.push_back(x_spec);
  p.out = {P()};
  p.out.insert(p.out.end(), param_specs.begin(), param_specs.end());
  p.out_ranks = {0, 2, 1, 2, 1};
  p.in_names = {"w1", "b1", "w2", "b2", "x"};
  p.out_names = {"loss", "grad_w1", "grad_b1", "grad_w2", "grad_b2"};
  p.run = true;
  p.fn = [](const std::vector<Array>& a) {
    auto loss = [](const std::vector<Array>& v) {
      Array h = gelu(add(matmul(v[4], v[0]), v[1]), true);
      Array y = add(matmul(h, v[2]), v[3]);
      return mean(square(y));
    };
    auto [value, grads] = value_and_grad(loss, {0, 1, 2, 3})(a);
    std::vector<Array> out = {value};
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  };
  return p;
}

struct Case {
  std::string name;  // the key in xla_collectives.json
  std::function<Program()> build;
  std::string bug;  // set when tessera sends more than XLA (the comparison is skipped)
};

// Per collective kind: calls and bytes per device, for both sides.
struct Row {
  int64_t count = 0;
  double bytes = 0;
};

std::map<std::string, Row> tessera_rows(const spmd::CommStats& s) {
  std::map<std::string, Row> rows;
  if (s.all_gather_calls) rows["all-gather"] = {s.all_gather_calls, s.all_gather_bytes};
  if (s.all_reduce_calls) rows["all-reduce"] = {s.all_reduce_calls, s.all_reduce_bytes};
  if (s.reduce_scatter_calls) rows["reduce-scatter"] = {s.reduce_scatter_calls, s.reduce_scatter_bytes};
  if (s.all_to_all_calls) rows["all-to-all"] = {s.all_to_all_calls, s.all_to_all_bytes};
  return rows;
}

std::map<std::string, Row> xla_rows(const nlohmann::json& c) {
  std::map<std::string, Row> rows;
  for (const auto& [kind, t] : c.at("totals").items())
    rows[kind] = {t.at("count").get<int64_t>(), t.at("bytes_per_device").get<double>()};
  return rows;
}

std::string table(const std::string& name, const std::map<std::string, Row>& ours,
                  const std::map<std::string, Row>& theirs, double our_total, double their_total) {
  std::string t = fmt::format("{}\n  {:<15} {:>8} {:>16} {:>8} {:>16}\n", name, "kind", "tessera", "bytes/device",
                              "XLA", "bytes/device");
  for (const char* kind : {"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"}) {
    auto a = ours.find(kind);
    auto b = theirs.find(kind);
    if (a == ours.end() && b == theirs.end()) continue;
    Row x = a == ours.end() ? Row{} : a->second;
    Row y = b == theirs.end() ? Row{} : b->second;
    t += fmt::format("  {:<15} {:>8} {:>16.0f} {:>8} {:>16.0f}\n", kind, x.count, x.bytes, y.count, y.bytes);
  }
  t += fmt::format("  {:<15} {:>8} {:>16.0f} {:>8} {:>16.0f}\n", "total", "", our_total, "", their_total);
  return t;
}

class XlaComparison : public ::testing::TestWithParam<Case> {};

TEST_P(XlaComparison, TesseraSendsNoMoreThanXla) {
  const Case& c = GetParam();
  const nlohmann::json& xla = xla_cases().at(c.name);
  Program p = c.build();
  // The JSON's mesh is the one built here.
  std::vector<std::string> names;
  for (const auto& [axis, size] : xla.at("mesh").items()) {
    names.push_back(axis);
    EXPECT_EQ(p.mesh.axis_size(axis), size.get<int>()) << c.name;
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(p.mesh.ndim()));
  // And so are the layouts (a JSON spec: one entry per dim, null / an axis / a list of axes).
  auto spec_of = [](const nlohmann::json& j) {
    PartitionSpec spec;
    for (const auto& e : j) {
      spmd::Axes axes;
      if (e.is_string()) axes.push_back(e.get<std::string>());
      if (e.is_array())
        for (const auto& a : e) axes.push_back(a.get<std::string>());
      spec.dims.push_back(axes);
    }
    return spec;
  };
  for (size_t i = 0; i < p.in.size(); ++i)
    EXPECT_EQ(spec_of(xla.at("in_shardings").at(p.in_names[i])), p.in[i]) << p.in_names[i];
  for (size_t i = 0; i < p.out.size(); ++i)
    EXPECT_EQ(spec_of(xla.at("out_shardings").at(p.out_names[i])), p.out[i]) << p.out_names[i];

  VirtualDevices devices(p.mesh.size());
  JitOptions options;
  for (size_t i = 0; i < p.in.size(); ++i)
    options.in_shardings.push_back(Sharding::from_spec(p.mesh, p.in[i], p.args[i].ndim()));
  for (size_t i = 0; i < p.out.size(); ++i)
    options.out_shardings.push_back(Sharding::from_spec(p.mesh, p.out[i], p.out_ranks[i]));
  auto f = jit(p.fn, options);
  Lowered lowered = f.lowered(p.args);
  ASSERT_NE(lowered.spmd(), nullptr);
  const spmd::PartitionedProgram& program = lowered.spmd()->program();
  for (size_t i = 0; i < p.out.size(); ++i) EXPECT_EQ(program.output_shardings[i].spec(), p.out[i]) << "output " << i;

  double ours = program.summary.per_device.total_bytes();
  double theirs = xla.at("total_bytes_per_device").get<double>();
  std::cout << table(c.name, tessera_rows(program.summary.per_device), xla_rows(xla), ours, theirs)
            << program.summary.text();
  if (!c.bug.empty()) GTEST_SKIP() << "BUG: " << c.bug;
  EXPECT_LE(ours, theirs) << c.name << ": tessera sends " << ours << " B/device, XLA " << theirs << "\n"
                          << program.summary.text();
  if (!p.run) return;

  // The MLP programs are small enough to run: the counted bytes are the bytes the
  // communicator moves, and the sharded step equals the unsharded one.
  std::vector<Array> args;
  for (size_t i = 0; i < p.args.size(); ++i)
    args.push_back(testing::random_array(p.args[i].shape(), 50 + i, i == 4 ? 1.0 : 0.1));
  std::vector<Array> expected = jit(p.fn)(args);
  std::vector<Array> got = f(args);
  ASSERT_EQ(got.size(), expected.size());
  const char* output_names[] = {"loss", "grad_w1", "grad_b1", "grad_w2", "grad_b2"};
  for (size_t i = 0; i < got.size(); ++i) testing::expect_close(got[i], expected[i], 1e-5, output_names[i]);
  for (const spmd::CommStats& s : lowered.spmd()->last_comm_stats()) {
    EXPECT_DOUBLE_EQ(s.total_bytes(), ours);
    EXPECT_EQ(s.total_calls(), program.summary.per_device.total_calls());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Spmd, XlaComparison,
    ::testing::Values(
        Case{"parallel_matmul_out_data_model", [] { return parallel_matmul(P("data", "model")); }, ""},
        Case{"parallel_matmul_out_data", [] { return parallel_matmul(P("data", None)); }, ""},
        Case{"mlp_dp",
             [] {
               return mlp("data", {P(), P(), P(), P()}, P("data", None));
             },
             ""},
        Case{"mlp_fsdp",
             [] {
               return mlp("fsdp", {P("fsdp", None), P("fsdp"), P("fsdp", None), P("fsdp")}, P("fsdp", None));
             },
             ""},
        Case{"mlp_tp",
             [] {
               return mlp("model", {P(None, "model"), P("model"), P("model", None), P()}, P());
             },
             ""}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
