// jit: tracing, the signature cache, static arguments, errors, the IR text,
// TESSERA_DUMP, serialization, the memory plan under poisoning, allocation-free runs,
// donation and checkpointing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <typeinfo>

#include "core/test_util.h"
#include "tessera/base/allocator.h"
#include "tessera/compiler/compile.h"
#include "tessera/compiler/parser.h"
#include "tessera/tessera.h"
#include "transformer_step.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

// Counts every operator new in this binary (the executable's runs must not allocate).
// AddressSanitizer replaces operator new itself, so the sanitizer build checks only
// the buffer allocator's count (the Release build checks both).
// Allocations larger than g_new_limit throw std::bad_alloc (a test that feeds crafted
// sizes lowers it, so a bug fails the test instead of taking the machine's memory).
namespace {
std::atomic<long> g_news{0};
std::atomic<size_t> g_new_limit{SIZE_MAX};
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCountingNew = false;
#else
constexpr bool kCountingNew = true;
#endif
}  // namespace
#if !defined(__SANITIZE_ADDRESS__)
// GCC cannot see that this operator delete pairs with the operator new above.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (n > g_new_limit.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace tessera::test {
namespace {

using compiler::Executable;

void expect_bitwise(const Array& a, const Array& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << ": values differ";
}

Array mlp_loss(const Tree& p, const Array& x, const Array& y) {
  Array h = gelu(add(matmul(x, p.at("w1").leaf()), p.at("b1").leaf()));
  Array out = add(matmul(h, p.at("w2").leaf()), p.at("b2").leaf());
  return mean(square(subtract(out, y)));
}

Tree mlp_params(int64_t in, int64_t hidden, int64_t out, uint32_t seed) {
  Tree p;
  p["w1"] = random_array({in, hidden}, seed, DType::Float32, -0.5, 0.5);
  p["b1"] = random_array({hidden}, seed + 1, DType::Float32, -0.1, 0.1);
  p["w2"] = random_array({hidden, out}, seed + 2, DType::Float32, -0.5, 0.5);
  p["b2"] = random_array({out}, seed + 3, DType::Float32, -0.1, 0.1);
  return p;
}

// One SGD step: (params, x, y) -> (params', loss).
Tree sgd_step(const Tree& args) {
  const Tree& p = args.at("params");
  auto [loss, g] =
      value_and_grad([&](const Tree& q) { return mlp_loss(q, args.at("x").leaf(), args.at("y").leaf()); })(p);
  Tree updated =
      tree_map([](const Array& w, const Array& d) { return subtract(w, multiply(d, Array::scalar(0.1f))); }, p, g);
  Tree out;
  out["params"] = updated;
  out["loss"] = loss;
  return out;
}

Tree step_args(uint32_t seed) {
  Tree args;
  args["params"] = mlp_params(8, 16, 4, seed);
  args["x"] = random_array({32, 8}, seed + 10, DType::Float32);
  args["y"] = random_array({32, 4}, seed + 11, DType::Float32);
  return args;
}

TEST(Jit, MatchesEagerAndCachesBySignature) {
  auto f = jit([](const Array& x) { return add(multiply(exp(x), x), Array::scalar(1.0f)); });
  Array x = random_array({4, 5}, 1, DType::Float32);
  Array eager = add(multiply(exp(x), x), Array::scalar(1.0f)).eval();
  expect_bitwise(f(x), eager, "jit vs eager");
  f(random_array({4, 5}, 2, DType::Float32));
  EXPECT_EQ(f.trace_count(), 1) << "same signature must not re-trace";
  f(random_array({3, 5}, 3, DType::Float32));
  EXPECT_EQ(f.trace_count(), 2) << "another shape re-traces";
  f(random_array({4, 5, 1}, 3, DType::Float32));
  EXPECT_EQ(f.trace_count(), 3) << "another rank re-traces";
  Array x64 = random_array({4, 5}, 4, DType::Float64);
  expect_bitwise(f(x64), add(multiply(exp(x64), x64), Array::scalar(1.0f)).eval(), "f64");
  EXPECT_EQ(f.trace_count(), 4) << "another dtype re-traces";
  EXPECT_EQ(f.cache_size(), 4u);
}

TEST(Jit, StaticArgumentsSelectCodePathsAndAreKeyed) {
  auto f = jit([](const Tree& a, const StaticArgs& s) -> Tree {
    Array x = a.leaves()[0];
    return s.at(0) ? Tree(relu(x)) : Tree(negative(x));
  });
  Array x = random_array({6}, 5, DType::Float32);
  expect_bitwise(f(Tree(x), {1}).leaf(), relu(x).eval(), "static=1");
  expect_bitwise(f(Tree(x), {0}).leaf(), negative(x).eval(), "static=0");
  f(Tree(x), {1});
  EXPECT_EQ(f.trace_count(), 2);
}

TEST(Jit, TrainingStepMatchesEagerForSeveralSteps) {
  auto step = jit(sgd_step);
  Tree jit_args = step_args(20), eager_args = step_args(20);
  for (int i = 0; i < 3; ++i) {
    Tree j = step(jit_args);
    Tree e = sgd_step(eager_args);
    std::vector<Array> jl = j.leaves(), el = e.leaves();
    eval(el);
    ASSERT_EQ(jl.size(), el.size());
    for (size_t k = 0; k < jl.size(); ++k) {
      std::vector<double> a = jl[k].to_vector<double>(), b = el[k].to_vector<double>();
      for (size_t t = 0; t < a.size(); ++t)
        ASSERT_NEAR(a[t], b[t], 1e-5 * (1 + std::abs(b[t]))) << "step " << i << " leaf " << j.paths()[k];
    }
    jit_args["params"] = j.at("params");
    eager_args["params"] = e.at("params");
  }
  EXPECT_EQ(step.trace_count(), 1);
}

TEST(Jit, AnotherTreeStructureIsAClearError) {
  auto f = jit([](const Tree& t) { return Tree(sum(t.leaves()[0])); });
  Tree a;
  a["x"] = random_array({3}, 1, DType::Float32);
  f(a);
  Tree b;
  b["z"] = random_array({3}, 1, DType::Float32);
  try {
    f(b);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("tree structure"), std::string::npos) << what;
    EXPECT_NE(what.find("z"), std::string::npos) << what;
    EXPECT_NE(what.find("x"), std::string::npos) << what;
  }
}

// The first call's argument tree fixes the structure later calls must have; the Jitted
// keeps it as placeholders, so an argument's buffer is freed when the caller drops it
// (it held a training run's first parameters for the whole run).
TEST(Jit, KeepsNoArgumentOfItsFirstCallAlive) {
  auto f = jit([](const Tree& t) { return Tree(sum(t.at("x").leaf())); });
  Tree args;
  args["x"] = random_array({1 << 20}, 1, DType::Float32);  // 4 MiB: an allocator block
  EXPECT_NEAR(f(args).leaf().item<double>(), sum(args.at("x").leaf()).item<double>(), 1e-2);
  const int64_t holding = allocator_stats().bytes_in_use;
  args = Tree();
  EXPECT_LE(allocator_stats().bytes_in_use, holding - (int64_t{4} << 20)) << "the argument's buffer is still held";
  Tree again;
  again["x"] = random_array({1 << 20}, 2, DType::Float32);
  EXPECT_NO_THROW(f(again));  // the structure is still checked and the cache still hits
}

TEST(Jit, BadCallsAreClearErrors) {
  Array x = random_array({3}, 1, DType::Float32);
  auto f = jit([](const Array& a) { return exp(a); }, JitOptions{{5}, {}, "donating"});
  EXPECT_TRUE(throws_with<ValueError>([&] { f(x); }, {"donate_leaves", "5", "1 leaves"}));
  auto g = jit([](const Array& a) { return exp(a); });
  Executable& exe = g.lowered(std::vector<Array>{x}).executable();
  EXPECT_TRUE(throws_with<ValueError>([&] { exe.run({random_array({4}, 1, DType::Float32)}); },
                                      {"argument 0", "f32[4]", "f32[3]"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { exe.run({}); }, {"0 arguments", "expected 1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { exe.run_into({x}, {}); }, {"run_into", "0 outputs"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { compiler::parse_type("f33[2]"); }, {"f32[4, 8]"}));
  EXPECT_EQ(compiler::to_string(compiler::parse_type("bf16[2, 3]")), "bf16[2, 3]");
}

TEST(Jit, ReadingAValueWhileTracingNamesTheOp) {
  auto f = jit([](const Array& x) {
    Array s = sum(x);
    float v = s.item<float>();
    return multiply(x, Array::scalar(v));
  });
  try {
    f(random_array({3}, 1, DType::Float32));
    FAIL() << "expected an error";
  } catch (const TransformError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("jit"), std::string::npos) << what;
    EXPECT_NE(what.find("sum"), std::string::npos) << what;
  }
}

TEST(Jit, LoweredTextIsTheTracedProgram) {
  auto f = jit([](const std::vector<Array>& a) { return std::vector<Array>{add(matmul(a[0], a[1]), a[2])}; });
  Array x = random_array({2, 3}, 1, DType::Float32), w = random_array({3, 4}, 2, DType::Float32),
        b = random_array({4}, 3, DType::Float32);
  std::string text = f.lowered({x, w, b}).text();
  EXPECT_EQ(text,
            "func @main(%0: f32[2, 3], %1: f32[3, 4], %2: f32[4]) -> (f32[2, 4]) {\n"
            "  %3 = matmul(%0, %1) : f32[2, 4]\n"
            "  %4 = add(%3, %2) : f32[2, 4]\n"
            "  return %4\n"
            "}\n");
  EXPECT_NE(f.lowered({x, w, b}).optimized_text().find("arena"), std::string::npos);
}

TEST(Jit, DumpWritesEveryPass) {
  std::string dir = (std::filesystem::temp_directory_path() / "tessera_dump_test").string();
  std::filesystem::remove_all(dir);
  compiler::Graph g = trace(detail::to_jit_fn([](const Array& x) { return exp(negative(negative(x))); }),
                            Tree(random_array({3}, 1, DType::Float32)));
  compiler::default_pipeline().run(g, dir);
  size_t files = 0;
  bool saw_traced = false, saw_simplify = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    std::string name = entry.path().filename().string();
    saw_traced = saw_traced || name.find("traced") != std::string::npos;
    saw_simplify = saw_simplify || name.find("simplify") != std::string::npos;
  }
  EXPECT_EQ(files, compiler::default_pipeline().passes().size() + 1);
  EXPECT_TRUE(saw_traced && saw_simplify);
  // negative(negative(x)) is gone after simplification.
  EXPECT_EQ(g.text().find("negative"), std::string::npos) << g.text();
  std::filesystem::remove_all(dir);
}

TEST(Jit, SerializedExecutableGivesBitwiseIdenticalOutputs) {
  Tree args = step_args(30);
  auto step = jit(sgd_step);
  Executable& exe = step.lowered(args).executable();
  std::string bytes = exe.serialize();
  std::unique_ptr<Executable> loaded = Executable::deserialize(bytes);
  EXPECT_EQ(loaded->graph().text(), exe.graph().text());
  EXPECT_EQ(loaded->serialize(), bytes) << "serialize(deserialize(b)) must be b";
  std::vector<Array> a = exe.run(args.leaves()), b = loaded->run(args.leaves());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_bitwise(a[i], b[i], "output " + std::to_string(i));

  std::string newer = bytes;
  uint32_t version = compiler::kExecutableFormatVersion + 1;
  std::memcpy(newer.data() + 4, &version, 4);
  EXPECT_THROW(Executable::deserialize(newer), ValueError);
  EXPECT_THROW(Executable::deserialize(bytes.substr(0, bytes.size() / 2)), ValueError);
  EXPECT_THROW(Executable::deserialize("not an executable"), ValueError);
}

// Crafted bytes (the body hash recomputed, so the damage is not caught by it): at every
// offset of the body in turn, 4 bytes set to 0xff. Each load either works or throws a
// tessera Error; none may reserve memory by a count the bytes cannot hold (a node's
// input count of 2^32 - 1 asked for 16 GiB), crash, or throw anything else. Every byte
// offset, since the records are not word-aligned.
TEST(Jit, CraftedExecutableBytesAreRefusedWithoutHugeAllocations) {
  Tree args = step_args(30);
  auto step = jit(sgd_step);
  const std::string bytes = step.lowered(args).executable().serialize();
  constexpr size_t kHeader = 24;  // "TSRX", u32 version, u64 body length, u64 body hash
  ASSERT_GT(bytes.size(), kHeader);
  int refused = 0;
  g_new_limit = size_t{256} << 20;  // the Release build: no allocation over 256 MiB
  for (size_t at = kHeader; at + 4 <= bytes.size(); ++at) {
    std::string crafted = bytes;
    std::memset(crafted.data() + at, 0xff, 4);
    const uint64_t hash = XXH3_64bits(crafted.data() + kHeader, crafted.size() - kHeader);
    std::memcpy(crafted.data() + 16, &hash, sizeof hash);
    try {
      Executable::deserialize(crafted);
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "0xffffffff at offset " << at << ": " << typeid(e).name() << ": " << e.what();
    }
  }
  g_new_limit = SIZE_MAX;
  EXPECT_GT(refused, 0);
}

// Format 2 keeps value ids, so the loaded program is the compiled one value for value;
// damage anywhere in the body, a forged body with a valid hash, or the old text format
// is rejected with ValueError instead of building a wrong program.
TEST(Jit, SerializedExecutableKeepsValueIdsAndRejectsDamage) {
  Tree args = step_args(31);
  auto step = jit(sgd_step);
  Executable& exe = step.lowered(args).executable();
  const std::string bytes = exe.serialize();
  std::unique_ptr<Executable> loaded = Executable::deserialize(bytes);
  ASSERT_EQ(loaded->graph().values.size(), exe.graph().values.size());
  ASSERT_EQ(loaded->plan().values.size(), exe.plan().values.size());
  for (size_t v = 0; v < exe.plan().values.size(); ++v) {
    EXPECT_EQ(loaded->graph().values[v].type, exe.graph().values[v].type) << "%" << v;
    EXPECT_EQ(loaded->plan().values[v].kind, exe.plan().values[v].kind) << "%" << v;
    EXPECT_EQ(loaded->plan().values[v].offset, exe.plan().values[v].offset) << "%" << v;
  }
  EXPECT_EQ(loaded->stats().flops, exe.stats().flops);
  EXPECT_EQ(loaded->stats().arena_bytes, exe.stats().arena_bytes);

  auto expect_rejected = [](const std::string& damaged, const std::string& why, const char* what) {
    SCOPED_TRACE(what);
    try {
      Executable::deserialize(damaged);
      ADD_FAILURE() << "damaged bytes were accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  constexpr size_t kBody = 4 + 4 + 8 + 8;  // magic, version, body length, body hash
  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x10;
  expect_rejected(flipped, "body hash", "a flipped byte");
  expect_rejected(bytes.substr(0, bytes.size() - 1), "truncated", "one byte short");
  // A forged body whose hash is right: the value count says more values than bytes.
  std::string forged = bytes;
  const uint64_t num_donated = [&] {
    uint64_t n = 0;
    std::memcpy(&n, bytes.data() + kBody, sizeof(n));
    return n;
  }();
  const size_t name_at = kBody + 8 + num_donated;
  uint64_t name_length = 0;
  std::memcpy(&name_length, bytes.data() + name_at, sizeof(name_length));
  const uint64_t absurd = uint64_t{1} << 40;
  std::memcpy(forged.data() + name_at + 8 + name_length, &absurd, sizeof(absurd));
  const uint64_t hash = XXH3_64bits(forged.data() + kBody, forged.size() - kBody);
  std::memcpy(forged.data() + 16, &hash, sizeof(hash));
  expect_rejected(forged, "value count", "a forged value count");
  std::string version1 = bytes;
  const uint32_t one = 1;
  std::memcpy(version1.data() + 4, &one, sizeof(one));
  expect_rejected(version1, "format version 1 is not supported", "the text format of version 1");
}

TEST(Jit, PoisonedFreedRegionsDoNotChangeResults) {
  // Any overlap of two live buffers in the plan would read poison (NaN) here.
  Tree args = step_args(40);
  auto step = jit(sgd_step);
  Executable& exe = step.lowered(args).executable();
  std::vector<Array> clean = exe.run(args.leaves());
  exe.set_poison_freed(true);
  std::vector<Array> poisoned = exe.run(args.leaves());
  exe.set_poison_freed(false);
  for (size_t i = 0; i < clean.size(); ++i) expect_bitwise(poisoned[i], clean[i], "output " + std::to_string(i));
  EXPECT_GT(exe.plan().arena_bytes, 0u);
}

// After one warm-up run (thread pool, BLAS), three run_into calls allocate no buffer
// and call no operator new, and give what run() gives.
void expect_run_into_allocates_nothing(Executable& exe, const std::vector<Array>& leaves) {
  std::vector<Array> outs;
  for (compiler::ValueId v : exe.graph().outputs)
    outs.push_back(Array::empty(exe.graph().type(v).shape, exe.graph().type(v).dtype));
  exe.run_into(leaves, outs);
  int64_t buffers_before = allocator_stats().allocations;
  long news_before = g_news.load();
  for (int i = 0; i < 3; ++i) exe.run_into(leaves, outs);
  EXPECT_EQ(allocator_stats().allocations - buffers_before, 0) << "buffer allocations per call";
  if (kCountingNew) {
    EXPECT_EQ(g_news.load() - news_before, 0) << "operator new calls per call";
  }
  std::vector<Array> reference = exe.run(leaves);
  for (size_t i = 0; i < outs.size(); ++i) expect_bitwise(outs[i], reference[i], "run_into vs run");
}

TEST(Jit, RunIntoAllocatesNothing) {
  Tree args = step_args(50);
  auto step = jit(sgd_step);
  Executable& exe = step.lowered(args).executable();
  expect_run_into_allocates_nothing(exe, args.leaves());
}

// A small GPT training step (attention, layer norm, cross-entropy, AdamW, fusion).
TEST(Jit, TransformerStepRunIntoAllocatesNothing) {
  bench::TransformerConfig c;
  c.vocab = 64;
  c.dim = 32;
  c.heads = 4;
  c.layers = 2;
  c.seq = 16;
  c.batch = 2;
  Tree params = bench::init_params(c, 11);
  Tree opt = bench::init_opt_state(params);
  Tree args = bench::step_args(params, opt, bench::random_tokens(c, 1), bench::random_tokens(c, 2));
  Jitted step = jit(bench::transformer_step_fn(c, AdamWConfig{.lr = 3e-3, .weight_decay = 0.01}));
  Executable& exe = step.lowered(args).executable();
  expect_run_into_allocates_nothing(exe, args.leaves());
}

// A bfloat16 training step (bf16 params and activations, float32 AdamW moments) sized
// so the 16-bit kernels (layer norm, softmax, cross-entropy, AdamW) split into several
// chunks: their widened-row scratch is taken inside parallel_for bodies.
Tree half_precision_step(const Tree& args) {
  const Array& x = args.at("x").leaf();
  const Array& targets = args.at("targets").leaf();
  auto loss_fn = [&](const Tree& p) {
    Array h = layer_norm(matmul(x, p.at("w1").leaf()), p.at("ln_w").leaf(), p.at("ln_b").leaf());
    Array attended = multiply(h, softmax(h));
    return cross_entropy(matmul(attended, p.at("w2").leaf()), targets);
  };
  auto [loss, grads] = value_and_grad(loss_fn)(args.at("params"));
  auto [params, opt] =
      bench::adamw_tree(args.at("params"), grads, args.at("opt"), AdamWConfig{.lr = 1e-2, .weight_decay = 0.01});
  return Tree{{"params", params}, {"opt", opt}, {"loss", loss}};
}

Tree half_precision_step_args(uint32_t seed) {
  constexpr int64_t kRows = 1024, kIn = 64, kHidden = 512, kClasses = 64;
  Tree params;
  params["w1"] = random_array({kIn, kHidden}, seed, DType::BFloat16, -0.2, 0.2);
  params["ln_w"] = random_array({kHidden}, seed + 1, DType::BFloat16, 0.5, 1.5);
  params["ln_b"] = random_array({kHidden}, seed + 2, DType::BFloat16, -0.1, 0.1);
  params["w2"] = random_array({kHidden, kClasses}, seed + 3, DType::BFloat16, -0.2, 0.2);
  std::vector<int32_t> targets(static_cast<size_t>(kRows));
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<int32_t>((i * 37 + seed) % kClasses);
  Tree args;
  args["params"] = params;
  args["opt"] = bench::init_opt_state(params.map([](const Array& p) { return astype(p, DType::Float32).eval(); }));
  args["x"] = random_array({kRows, kIn}, seed + 4, DType::BFloat16);
  args["targets"] = Array::from_vector<int32_t>(targets, {kRows});
  return args;
}

// The same step with both matmuls as int8 (AQT) GEMMs, their backward GEMMs int8 too
// with stochastic rounding from the step's key: the quantized operands and their scales
// live in per-thread scratch, which a warm run must not grow.
Tree int8_step(const Tree& args) {
  const Array& x = args.at("x").leaf();
  const Array& targets = args.at("targets").leaf();
  const Array& key = args.at("key").leaf();
  auto loss_fn = [&](const Tree& p) {
    const QuantizedMatmulOptions first{.salt = 1, .key = key}, second{.salt = 2, .key = key};
    Array h = layer_norm(quantized_matmul(x, p.at("w1").leaf(), first), p.at("ln_w").leaf(), p.at("ln_b").leaf());
    Array attended = multiply(h, softmax(h));
    return cross_entropy(quantized_matmul(attended, p.at("w2").leaf(), second), targets);
  };
  auto [loss, grads] = value_and_grad(loss_fn)(args.at("params"));
  auto [params, opt] =
      bench::adamw_tree(args.at("params"), grads, args.at("opt"), AdamWConfig{.lr = 1e-2, .weight_decay = 0.01});
  return Tree{{"params", params}, {"opt", opt}, {"loss", loss}};
}

// Puts the pool back to its size at construction (also when an assertion returns early).
struct ThreadCountRestorer {
  int saved = num_threads();
  ~ThreadCountRestorer() { set_num_threads(saved); }
};

// Resizing the pool starts fresh workers, whose first chunks of every kernel then run in
// the counted calls: per-thread scratch grown inside a parallel_for body would show up.
// Runs a compiled step warm with 1, 2 and 3 threads: no buffer allocation, no operator
// new, and bitwise the outputs of a plain run.
void expect_warm_runs_allocate_nothing(Executable& exe, const Tree& args) {
  std::vector<Array> leaves = args.leaves();
  std::vector<Array> outs;
  for (compiler::ValueId v : exe.graph().outputs)
    outs.push_back(Array::empty(exe.graph().type(v).shape, exe.graph().type(v).dtype));
  const ThreadCountRestorer restore_threads;
  exe.run_into(leaves, outs);  // warm-up (thread pool, BLAS)
  const std::vector<Array> reference = exe.run(leaves);
  for (size_t i = 0; i < outs.size(); ++i) expect_bitwise(outs[i], reference[i], "run_into vs run");
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    int64_t buffers_before = allocator_stats().allocations;
    long news_before = g_news.load();
    for (int i = 0; i < 3; ++i) exe.run_into(leaves, outs);
    EXPECT_EQ(allocator_stats().allocations - buffers_before, 0) << "buffer allocations, threads=" << threads;
    if (kCountingNew) {
      EXPECT_EQ(g_news.load() - news_before, 0) << "operator new calls, threads=" << threads;
    }
    for (size_t i = 0; i < outs.size(); ++i)
      expect_bitwise(outs[i], reference[i], "output " + std::to_string(i) + ", threads=" + std::to_string(threads));
  }
}

TEST(Jit, HalfPrecisionStepRunIntoAllocatesNothing) {
  Tree args = half_precision_step_args(70);
  auto step = jit(half_precision_step);
  expect_warm_runs_allocate_nothing(step.lowered(args).executable(), args);
}

TEST(Jit, Int8StepRunIntoAllocatesNothing) {
  Tree args = half_precision_step_args(71);
  args["key"] = key(5);
  auto step = jit(int8_step);
  expect_warm_runs_allocate_nothing(step.lowered(args).executable(), args);
}

TEST(Jit, DonatedParametersAreUpdatedInPlace) {
  // AdamW over donated param and state: outputs reuse the argument buffers.
  auto update = jit(
      [](const std::vector<Array>& a) {
        AdamWConfig c;
        c.lr = 0.01;
        return adamw_update(a[0], a[1], a[2], a[3], c);
      },
      JitOptions{{0, 2, 3}, {}, "adamw"});
  Array p = random_array({64}, 1, DType::Float32), g = random_array({64}, 2, DType::Float32);
  Array m = zeros({64}), v = zeros({64});
  AdamWConfig c;
  c.lr = 0.01;
  Array expected = adamw_update(p, g, m, v, c)[0].eval();
  const void* p_buffer = p.raw_data();
  std::vector<Array> out = update({p, g, m, v});
  expect_bitwise(out[0], expected, "updated param");
  EXPECT_EQ(out[0].raw_data(), p_buffer) << "the donated parameter's buffer holds the update";
  EXPECT_EQ(update.lowered({out[0], g, out[1], out[2]}).executable().plan().donations, 3);
}

TEST(Jit, DonatedLionParametersAreUpdatedInPlace) {
  // Lion with the learning rate as an array (as Optimizer traces it) over a donated
  // parameter and moment: the outputs reuse their buffers and equal the eager update
  // bitwise, for float32 and bfloat16 parameters (float32 moment) of an odd size.
  LionConfig c;
  c.weight_decay = 0.1;
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(name(dtype));
    auto update = jit([c](const std::vector<Array>& a) { return lion_update(a[0], a[1], a[2], a[3], c); },
                      JitOptions{{0, 2}, {}, "lion"});
    Array p = random_array({1037}, 1, dtype), g = random_array({1037}, 2, dtype);
    Array m = random_array({1037}, 3, DType::Float32, -0.1, 0.1), lr = Array::scalar(0.01, DType::Float32);
    std::vector<Array> expected = lion_update(p, g, m, lr, c);
    eval(expected);
    const void* p_buffer = p.raw_data();
    const void* m_buffer = m.raw_data();
    std::vector<Array> out = update({p, g, m, lr});
    ASSERT_EQ(out.size(), 2u);
    expect_bitwise(out[0], expected[0], "updated param");
    expect_bitwise(out[1], expected[1], "updated m");
    EXPECT_EQ(out[0].raw_data(), p_buffer) << "the donated parameter's buffer holds the update";
    EXPECT_EQ(out[1].raw_data(), m_buffer) << "the donated moment's buffer holds the update";
    EXPECT_EQ(update.lowered({out[0], g, out[1], lr}).executable().plan().donations, 2);
  }
}

TEST(Jit, CheckpointRecomputesAndLowersPeakMemory) {
  // A deep stack of tanh layers: without remat every layer's activations live until
  // the backward pass; with full checkpointing per layer only the layer inputs do.
  const int layers = 8;
  auto loss_fn = [&](bool remat) {
    return [=](const Tree& args) -> Tree {
      auto f = [&](const std::vector<Array>& a) {
        Array h = a[0];
        for (int l = 0; l < layers; ++l) {
          ArrayFn layer = [](const std::vector<Array>& in) {
            // The backward pass of the product reads sin(x) and cos(x): intermediates.
            return std::vector<Array>{tanh(multiply(sin(in[0]), cos(in[0])))};
          };
          h = (remat ? checkpoint(layer) : layer)({h})[0];
        }
        return sum(h);
      };
      auto [value, grads] = value_and_grad([&](const std::vector<Array>& a) { return f(a); })({args.leaves()[0]});
      return Tree::list({Tree(value), Tree(grads[0])});
    };
  };
  Array x = random_array({256, 256}, 7, DType::Float32);
  compiler::CompileOptions no_fusion;
  no_fusion.fuse = false;  // measure the effect of remat alone
  auto plain = jit(loss_fn(false), JitOptions{{}, no_fusion, "plain"});
  auto remat = jit(loss_fn(true), JitOptions{{}, no_fusion, "remat"});
  Tree a = plain(Tree(x)), b = remat(Tree(x));
  for (size_t i = 0; i < 2; ++i) expect_bitwise(a.leaves()[i], b.leaves()[i], "remat changes no value");
  const auto& ps = plain.lowered(Tree(x)).executable().stats();
  const auto& rs = remat.lowered(Tree(x)).executable().stats();
  EXPECT_LT(rs.arena_bytes, ps.arena_bytes) << "checkpointing must lower the arena";
  EXPECT_GT(rs.flops, ps.flops) << "checkpointing recomputes the forward pass";
}

TEST(Eval, CompiledGraphsAreCachedByStructure) {
  Array x = random_array({16}, 1, DType::Float32);
  auto before = compiler::eval_cache_stats();
  for (int i = 0; i < 3; ++i) add(exp(x), Array::scalar(static_cast<float>(i))).eval();
  auto after = compiler::eval_cache_stats();
  EXPECT_GE(after.hits - before.hits, 2u);
}

TEST(Eval, CachedArenasStayWithinTheBudget) {
  // A big eager graph (a whole step evaluated without jit) runs, but its arena is not
  // pinned by the cache afterwards.
  const size_t budget = size_t{4} << 20;
  compiler::set_eval_cache_budget(budget);
  Array x = random_array({1024, 1024}, 9, DType::Float32, -0.05, 0.05);
  // Two GEMM results of 4 MiB live in the arena (8 MiB): more than the budget.
  Array y = sum(matmul(tanh(matmul(x, x)), x), {1});
  auto before_big = compiler::eval_cache_stats();
  y.eval();
  auto stats = compiler::eval_cache_stats();
  EXPECT_EQ(stats.misses - before_big.misses, 1u) << "the big graph was compiled";
  EXPECT_LE(stats.arena_bytes, budget) << "the big graph's arena must not stay cached";
  std::vector<float> v = y.to_vector<float>();
  EXPECT_TRUE(std::isfinite(v[0]) && std::isfinite(v[1023]));
  // Small graphs are still cached.
  auto before = compiler::eval_cache_stats();
  for (int i = 0; i < 2; ++i) exp(random_array({8}, 1, DType::Float32)).eval();
  EXPECT_GE(compiler::eval_cache_stats().hits - before.hits, 1u);
  compiler::set_eval_cache_budget(size_t{256} << 20);
}

TEST(Eval, IntermediatesTheCallerHoldsGetValues) {
  Array x = random_array({8}, 1, DType::Float32);
  Array y = exp(x);
  Array z = add(y, y);
  z.eval();
  EXPECT_TRUE(y.is_evaluated()) << "y is held by the caller, so eval(z) computes it too";
  std::vector<float> yv = y.to_vector<float>(), zv = z.to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(zv[i], yv[i] + yv[i]);
}

}  // namespace
}  // namespace tessera::test
