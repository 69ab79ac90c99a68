// The persistent compilation cache: jit stores and reloads executables with bitwise
// identical results, keys are canonical and name what changed, damaged entries are
// recompiled, an unusable directory only warns, the size bound evicts least recently
// used entries, and concurrent writers of one key leave a valid entry. The index: a
// call with a cache identity found in it loads without tracing (bitwise the same
// results); another identity, shape, dtype, static argument, option or donation
// misses; a damaged, dangling or forged index entry falls back to tracing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "api/jit_cache_index.h"
#include "core/test_util.h"
#include "tessera/base/version.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/compile.h"
#include "tessera/tessera.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::test {
namespace {

namespace fs = std::filesystem;
using compiler::CacheKey;
using compiler::CompilationCache;

Tree mlp_params(uint32_t seed) {
  Tree p;
  p["w1"] = random_array({8, 16}, seed, DType::Float32, -0.5, 0.5);
  p["b1"] = random_array({16}, seed + 1, DType::Float32, -0.1, 0.1);
  p["w2"] = random_array({16, 4}, seed + 2, DType::Float32, -0.5, 0.5);
  p["b2"] = random_array({4}, seed + 3, DType::Float32, -0.1, 0.1);
  return p;
}

// One SGD step of a two-layer MLP with step size `lr` (a traced constant).
JitFn sgd_step(float lr) {
  return [lr](const Tree& args, const StaticArgs&) -> Tree {
    auto loss_of = [&](const Tree& p) {
      Array h = gelu(add(matmul(args.at("x").leaf(), p.at("w1").leaf()), p.at("b1").leaf()));
      Array out = add(matmul(h, p.at("w2").leaf()), p.at("b2").leaf());
      return mean(square(subtract(out, args.at("y").leaf())));
    };
    auto [loss, g] = value_and_grad(loss_of)(args.at("params"));
    Tree updated =
        tree_map([lr](const Array& w, const Array& d) { return subtract(w, multiply(d, Array::scalar(lr))); },
                 args.at("params"), g);
    return Tree{{"params", updated}, {"loss", loss}};
  };
}

Tree step_args(uint32_t seed) {
  return Tree{{"params", mlp_params(seed)},
              {"x", random_array({32, 8}, seed + 10, DType::Float32)},
              {"y", random_array({32, 4}, seed + 11, DType::Float32)}};
}

void expect_bitwise(const Tree& a, const Tree& b, const std::string& what) {
  std::vector<Array> la = a.leaves(), lb = b.leaves();
  ASSERT_EQ(la.size(), lb.size()) << what;
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_EQ(la[i].shape(), lb[i].shape()) << what << " leaf " << i;
    EXPECT_EQ(std::memcmp(la[i].raw_data(), lb[i].raw_data(), la[i].nbytes()), 0)
        << what << ": leaf " << i << " differs";
  }
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }

std::vector<fs::path> entry_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& d : fs::directory_iterator(dir))
    if (d.path().extension() == ".tsxc") out.push_back(d.path());
  return out;
}

class CompilationCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("tessera_cc_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    compiler::set_compilation_cache(dir_.string());
  }
  void TearDown() override {
    compiler::set_compilation_cache("");
    fs::remove_all(dir_);
  }
  // A fresh jit (its in-memory signature cache empty) and a fresh process-wide cache
  // object: what a new process sees, with only the directory in common.
  Tree run_fresh(const JitFn& fn, const Tree& args, JitOptions options = {}) {
    compiler::set_compilation_cache(dir_.string());
    Jitted j(fn, std::move(options));
    return j(args);
  }
  fs::path dir_;
};

TEST_F(CompilationCacheTest, CachedStepIsBitwiseIdenticalAndSecondJitHitsDisk) {
  const Tree args = step_args(3);
  compiler::set_compilation_cache("");
  const Tree uncached = Jitted(sgd_step(0.1f), {})(args);

  auto before = compiler::compilation_cache_stats();
  const Tree first = run_fresh(sgd_step(0.1f), args);
  auto after_first = compiler::compilation_cache_stats();
  EXPECT_EQ(after_first.misses - before.misses, 1u);
  EXPECT_EQ(after_first.stores - before.stores, 1u);
  ASSERT_EQ(entry_files(dir_).size(), 1u);

  const Tree second = run_fresh(sgd_step(0.1f), args);
  auto after_second = compiler::compilation_cache_stats();
  EXPECT_EQ(after_second.hits - after_first.hits, 1u) << "a fresh jit of the same function must load from disk";
  EXPECT_EQ(after_second.misses, after_first.misses);
  expect_bitwise(first, uncached, "compiled with the cache vs without");
  expect_bitwise(second, uncached, "loaded from the cache vs compiled");

  // The loaded executable is the compiled one: same optimized program and cost.
  compiler::set_compilation_cache("");
  Jitted plain(sgd_step(0.1f), {});
  const Lowered compiled = plain.lowered(args);
  compiler::set_compilation_cache(dir_.string());
  Jitted cached(sgd_step(0.1f), {});
  const Lowered loaded = cached.lowered(args);
  EXPECT_EQ(loaded.optimized_text(), compiled.optimized_text());
  EXPECT_EQ(loaded.executable().stats().flops, compiled.executable().stats().flops);
}

TEST_F(CompilationCacheTest, KeysAreCanonicalAndIncludeConstantsByValue) {
  const Tree args = step_args(4);
  const compiler::Graph a = trace(sgd_step(0.1f), args);
  const compiler::Graph b = trace(sgd_step(0.1f), args);
  ASSERT_EQ(a.text(), b.text()) << "tracing one program twice must print the same text";
  const CacheKey ka = compiler::make_cache_key(a, {}, {}, "cpu");
  EXPECT_EQ(ka.fingerprint(), compiler::make_cache_key(b, {}, {}, "cpu").fingerprint());
  EXPECT_EQ(ka.fingerprint().size(), 32u);
  EXPECT_EQ(CacheKey::from_json(ka.to_json()).fingerprint(), ka.fingerprint());
  EXPECT_NE(ka.fingerprint(), compiler::make_cache_key(trace(sgd_step(0.2f), args), {}, {}, "cpu").fingerprint())
      << "another step size (a scalar constant) must change the key";

  // A large constant prints as a hash in the text; its bytes are in the key too.
  auto with_table = [](float v) -> JitFn {
    return [v](const Tree& t, const StaticArgs&) -> Tree {
      std::vector<double> table(64, 1.0);
      table[63] = v;
      return Tree(add(t.leaf(), make_array(table, {64}, DType::Float32)));
    };
  };
  const Tree x(random_array({64}, 5, DType::Float32));
  const CacheKey k1 = compiler::make_cache_key(trace(with_table(1.0f), x), {}, {}, "cpu");
  const CacheKey k2 = compiler::make_cache_key(trace(with_table(2.0f), x), {}, {}, "cpu");
  EXPECT_NE(k1.constants, k2.constants);
  EXPECT_NE(k1.fingerprint(), k2.fingerprint());
  EXPECT_EQ(k1.program, "main");
  EXPECT_EQ(k1.compiler_version, tessera::version());
}

TEST_F(CompilationCacheTest, ChangedOptionsGraphOrDonationMissAndExplainNamesThePart) {
  const Tree args = step_args(5);
  run_fresh(sgd_step(0.1f), args);
  CompilationCache cache(dir_);
  EXPECT_NE(cache.explain().find("no other entry of program main"), std::string::npos) << cache.explain();

  JitOptions no_fusion;
  no_fusion.compile.fuse = false;
  auto before = compiler::compilation_cache_stats();
  const Tree unfused = run_fresh(sgd_step(0.1f), args, no_fusion);
  EXPECT_EQ(compiler::compilation_cache_stats().misses - before.misses, 1u) << "another option must miss";
  std::string why = cache.explain();
  EXPECT_NE(why.find("differs in: options\n"), std::string::npos) << why;
  EXPECT_NE(why.find("fuse=0"), std::string::npos) << why;

  run_fresh(sgd_step(0.25f), args);
  why = cache.explain();
  EXPECT_NE(why.find("differs in: graph"), std::string::npos) << why;
  EXPECT_EQ(why.find("options"), std::string::npos) << "the nearest entry has the same options: " << why;

  JitOptions donate;
  donate.donate_leaves = {0, 1};
  run_fresh(sgd_step(0.1f), step_args(6), donate);
  why = cache.explain();
  EXPECT_NE(why.find("differs in: donation\n"), std::string::npos) << why;
  EXPECT_EQ(entry_files(dir_).size(), 4u);
}

TEST_F(CompilationCacheTest, CorruptEntriesAreDetectedRemovedAndRecompiled) {
  const Tree args = step_args(7);
  const Tree good = run_fresh(sgd_step(0.1f), args);
  ASSERT_EQ(entry_files(dir_).size(), 1u);
  const fs::path entry = entry_files(dir_)[0];
  const std::string bytes = read_bytes(entry);

  struct Damage {
    const char* what;
    std::string bytes;
    const char* reason;  // what the warning must say
  };
  // Parameter 0's donation flag (the first body byte after the executable's "TSRX",
  // u32 version, u64 body length, u64 body hash and the u64 flag count): a flag that
  // still decodes, so the entry's payload hash is what tells.
  std::string flipped = bytes;
  const size_t executable = bytes.find("TSRX");
  ASSERT_NE(executable, std::string::npos);
  const size_t flag = executable + 4 + 4 + 8 + 8 + 8;
  ASSERT_EQ(flipped[flag], 0);
  flipped[flag] ^= 0x01;
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  for (const Damage& d :
       {Damage{"a flipped payload byte", flipped, "payload hash mismatch"},
        Damage{"a truncated file", bytes.substr(0, 200), "truncated"}, Damage{"a bad magic", bad_magic, "bad magic"}}) {
    SCOPED_TRACE(d.what);
    write_bytes(entry, d.bytes);
    auto before = compiler::compilation_cache_stats();
    ::testing::internal::CaptureStderr();
    const Tree again = run_fresh(sgd_step(0.1f), args);
    const std::string err = ::testing::internal::GetCapturedStderr();
    auto after = compiler::compilation_cache_stats();
    EXPECT_EQ(after.corrupt - before.corrupt, 1u);
    EXPECT_EQ(after.hits, before.hits);
    EXPECT_EQ(after.stores - before.stores, 1u) << "the recompiled program must be stored again";
    EXPECT_NE(err.find("is corrupt"), std::string::npos) << err;
    EXPECT_NE(err.find(d.reason), std::string::npos) << err;
    expect_bitwise(again, good, "recompiled after damage");
    EXPECT_EQ(read_bytes(entry), bytes) << "the rewritten entry must equal the original";
  }
}

TEST_F(CompilationCacheTest, UnwritableDirectoryWarnsOnceAndRunsWithoutTheCache) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "a_file";
  write_bytes(file, "not a directory");
  const fs::path bad = file / "cache";
  const Tree args = step_args(8);
  ::testing::internal::CaptureStderr();
  compiler::set_compilation_cache(bad.string());
  const Tree a = Jitted(sgd_step(0.1f), {})(args);
  const Tree b = Jitted(sgd_step(0.1f), {})(args);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(compiler::compilation_cache(), nullptr);
  const size_t first = err.find("warning: compilation cache: cannot create");
  EXPECT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("warning: compilation cache", first + 1), std::string::npos) << "warn once: " << err;
  compiler::set_compilation_cache("");
  expect_bitwise(a, Jitted(sgd_step(0.1f), {})(args), "without a usable cache");
  expect_bitwise(b, a, "second call");
}

// Small executables of distinct programs (entries of similar size).
std::pair<CacheKey, std::unique_ptr<compiler::Executable>> program(const std::string& name, float c) {
  compiler::Graph g =
      trace([c](const Tree& t, const StaticArgs&) { return Tree(multiply(exp(t.leaf()), Array::scalar(c))); },
            Tree(random_array({16}, 1, DType::Float32)));
  g.name = name;
  CacheKey key = compiler::make_cache_key(g, {}, {}, "cpu");
  return {key, compiler::compile(g)};
}

TEST_F(CompilationCacheTest, SizeBoundEvictsLeastRecentlyUsedFirst) {
  CompilationCache unbounded(dir_);
  std::vector<std::pair<CacheKey, std::unique_ptr<compiler::Executable>>> p;
  for (int i = 0; i < 4; ++i) p.push_back(program(fmt::format("p{}", i), static_cast<float>(i)));
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); };
  for (int i = 0; i < 3; ++i) {
    unbounded.store(p[i].first, *p[i].second);
    pause();
  }
  ASSERT_NE(unbounded.load(p[0].first), nullptr);  // p0 is now the most recently used
  pause();
  uint64_t entry_bytes = 0;
  for (const auto& e : unbounded.entries()) entry_bytes = std::max(entry_bytes, e.bytes);

  // Room for three entries: storing a fourth evicts p1 (the least recently used), not p0.
  CompilationCache bounded(dir_, 3 * entry_bytes + entry_bytes / 2);
  bounded.store(p[3].first, *p[3].second);
  std::vector<std::string> left;
  uint64_t total = 0;
  for (const auto& e : bounded.entries()) {
    left.push_back(e.program);
    total += e.bytes;
  }
  EXPECT_EQ(left, (std::vector<std::string>{"p3", "p0", "p2"})) << "most recently used first";
  EXPECT_LE(total, bounded.max_bytes());
  EXPECT_EQ(bounded.stats().evictions, 1u);
  EXPECT_EQ(bounded.load(p[1].first), nullptr);

  bounded.evict_to(entry_bytes + entry_bytes / 2);
  ASSERT_EQ(bounded.entries().size(), 1u);
  EXPECT_EQ(bounded.entries()[0].program, "p3");
  EXPECT_EQ(bounded.clear(), 1u);
  EXPECT_TRUE(bounded.entries().empty());
}

TEST_F(CompilationCacheTest, ConcurrentWritersOfOneKeyLeaveAValidEntry) {
  CompilationCache cache(dir_);
  auto [key, exe] = program("shared", 2.0f);
  std::atomic<int> bad_loads{0};
  auto writer = [&] {
    for (int i = 0; i < 20; ++i) cache.store(key, *exe);
  };
  auto reader = [&] {
    for (int i = 0; i < 40; ++i) {
      if (auto loaded = cache.load(key); loaded && loaded->serialize() != exe->serialize()) ++bad_loads;
    }
  };
  std::thread t1(writer), t2(writer), t3(reader);
  t1.join();
  t2.join();
  t3.join();
  EXPECT_EQ(bad_loads.load(), 0);
  EXPECT_EQ(cache.stats().corrupt, 0u) << "a reader must never see a half-written entry";
  EXPECT_EQ(cache.stats().stores, 40u);
  std::unique_ptr<compiler::Executable> loaded = cache.load(key);
  ASSERT_NE(loaded, nullptr);
  EXPECT_EQ(loaded->serialize(), exe->serialize());
  for (const auto& d : fs::directory_iterator(dir_))
    EXPECT_EQ(d.path().filename().string().find(".tmp"), std::string::npos)
        << "temporary file left behind: " << d.path();
}

// A reader racing the first writer of an entry sees no entry or the whole entry, never
// a "corrupt" one: an entry that appears between the reader's open and a later check
// of the file system must not be taken for an empty, damaged file (and deleted).
TEST_F(CompilationCacheTest, ReadersRacingTheFirstStoreNeverSeeACorruptEntry) {
  for (int round = 0; round < 20; ++round) {
    const fs::path dir = dir_ / fmt::format("round{}", round);
    CompilationCache cache(dir);
    auto [key, exe] = program("first_store", 3.0f);
    std::atomic<bool> stored{false};
    std::thread writer([&] {
      cache.store(key, *exe);
      stored = true;
    });
    int loads = 0;
    while (!stored.load() || loads < 2) {
      if (auto loaded = cache.load(key)) {
        EXPECT_EQ(loaded->serialize(), exe->serialize());
      }
      ++loads;
    }
    writer.join();
    EXPECT_EQ(cache.stats().corrupt, 0u) << "round " << round;
    EXPECT_NE(cache.load(key), nullptr) << "the stored entry survives its readers (round " << round << ")";
  }
}

// ---- the index: a second level keyed on the call, so a hit skips tracing ----

// `fn`, counting its calls (each trace calls it once).
JitFn counted(JitFn fn, std::shared_ptr<int> calls) {
  return [fn = std::move(fn), calls](const Tree& args, const StaticArgs& statics) {
    ++*calls;
    return fn(args, statics);
  };
}

std::vector<fs::path> index_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& d : fs::directory_iterator(dir))
    if (d.path().extension() == ".tsxi") out.push_back(d.path());
  return out;
}

JitOptions with_identity(const std::string& identity) {
  JitOptions options;
  options.cache_identity = identity;
  return options;
}

class CompilationIndexTest : public CompilationCacheTest {
 protected:
  // A fresh jit of the SGD step (lr 0.1) against the cache directory, as a new process
  // would make it; returns its result and sets traces_ to how often it traced.
  Tree run_indexed(const Tree& args, JitOptions options, const StaticArgs& statics = {}) {
    compiler::set_compilation_cache(dir_.string());
    auto calls = std::make_shared<int>(0);
    Jitted j(counted(sgd_step(0.1f), calls), std::move(options));
    Tree out = j(args, statics);
    traces_ = j.trace_count();
    EXPECT_EQ(*calls, traces_) << "trace_count() counts every call of the function";
    return out;
  }
  int traces_ = -1;
};

TEST_F(CompilationIndexTest, IndexHitSkipsTracingAndIsBitwiseIdentical) {
  const Tree args = step_args(3);
  compiler::set_compilation_cache("");
  const Tree uncached = Jitted(sgd_step(0.1f), {})(args);

  const auto s0 = compiler::compilation_cache_stats();
  const Tree cold = run_indexed(args, with_identity("mlp sgd lr=0.1"));
  const auto s1 = compiler::compilation_cache_stats();
  EXPECT_EQ(traces_, 1);
  EXPECT_EQ(s1.index_misses - s0.index_misses, 1u);
  EXPECT_EQ(s1.index_hits, s0.index_hits);
  ASSERT_EQ(index_files(dir_).size(), 1u) << "the traced call writes its index entry";
  ASSERT_EQ(entry_files(dir_).size(), 1u);

  const Tree warm = run_indexed(args, with_identity("mlp sgd lr=0.1"));
  const auto s2 = compiler::compilation_cache_stats();
  EXPECT_EQ(traces_, 0) << "an index hit must not trace";
  EXPECT_EQ(s2.index_hits - s1.index_hits, 1u);
  EXPECT_EQ(s2.hits - s1.hits, 1u) << "the hit loads the full entry";
  EXPECT_EQ(s2.misses, s1.misses);
  EXPECT_EQ(s2.index_corrupt, s0.index_corrupt);
  ASSERT_TRUE(warm.same_structure(cold)) << "the output tree is rebuilt from the index entry";
  expect_bitwise(warm, cold, "index hit vs cold compile");
  expect_bitwise(warm, uncached, "index hit vs no cache");

  // lowered() on a hit: the executable, no traced graph, still no trace.
  compiler::set_compilation_cache(dir_.string());
  Jitted lowered_only(sgd_step(0.1f), with_identity("mlp sgd lr=0.1"));
  const Lowered lowered = lowered_only.lowered(args);
  EXPECT_EQ(lowered_only.trace_count(), 0);
  EXPECT_TRUE(lowered.graph().nodes.empty());
  EXPECT_EQ(lowered.executable().graph().parameters.size(), args.leaves().size());

  // Without an identity the index is neither read nor written: the call traces.
  run_indexed(args, {});
  EXPECT_EQ(traces_, 1);
  EXPECT_EQ(index_files(dir_).size(), 1u);
}

TEST_F(CompilationIndexTest, ChangedIdentityShapeDtypeStaticsOptionsOrDonationMiss) {
  const Tree args = step_args(3);
  run_indexed(args, with_identity("v1"));
  ASSERT_EQ(traces_, 1);

  auto expect_miss = [&](const std::string& what, const Tree& call_args, JitOptions options,
                         const StaticArgs& statics = {}) {
    const auto before = compiler::compilation_cache_stats();
    run_indexed(call_args, std::move(options), statics);
    const auto after = compiler::compilation_cache_stats();
    EXPECT_EQ(traces_, 1) << what << " must trace";
    EXPECT_EQ(after.index_hits, before.index_hits) << what;
    EXPECT_EQ(after.index_misses - before.index_misses, 1u) << what;
    EXPECT_EQ(after.index_corrupt, before.index_corrupt) << what << " is a miss, not a damaged entry";
  };
  expect_miss("another identity", args, with_identity("v2"));
  Tree wide = args;
  wide["x"] = random_array({16, 8}, 20, DType::Float32);
  wide["y"] = random_array({16, 4}, 21, DType::Float32);
  expect_miss("another batch size", wide, with_identity("v1"));
  Tree f64 = args;
  f64["y"] = random_array({32, 4}, 22, DType::Float64);
  expect_miss("another dtype", f64, with_identity("v1"));
  expect_miss("another static argument", args, with_identity("v1"), {7});
  JitOptions unfused = with_identity("v1");
  unfused.compile.fuse = false;
  expect_miss("another compile option", args, unfused);
  JitOptions donating = with_identity("v1");
  donating.donate_leaves = {0};
  expect_miss("another donation", step_args(3), donating);

  // Each variant has its own entry: the first call still hits.
  run_indexed(args, with_identity("v1"));
  EXPECT_EQ(traces_, 0);
  EXPECT_EQ(index_files(dir_).size(), 7u);
}

TEST_F(CompilationIndexTest, KeyHoldsTheBuildIdentityAndEveryPart) {
  const std::string& build = compiler::build_identity();
  ASSERT_FALSE(build.empty()) << "the index is off without a build identity";
  EXPECT_TRUE(build.starts_with(std::string(version()) + " ")) << build;
  const Tree args = step_args(3);
  const compiler::IndexKey key = compiler::jit_index_key(with_identity("v1"), args, "sig", {false});
  std::map<std::string, std::string> parts(key.parts.begin(), key.parts.end());
  EXPECT_EQ(parts["build"], build);
  EXPECT_EQ(parts["identity"], "v1");
  EXPECT_EQ(parts["jit"], "main");
  EXPECT_EQ(parts["device"], "cpu");
  EXPECT_NE(parts["arguments"].find("1:x<f32:32,8>"), std::string::npos) << parts["arguments"];
  // Another build (or any other part) is another key.
  compiler::IndexKey rebuilt = key;
  for (auto& [name, value] : rebuilt.parts)
    if (name == "build") value += "-rebuilt";
  EXPECT_NE(rebuilt.fingerprint(), key.fingerprint());
  // The structure text reads back (keys with the text's own delimiters included).
  const Tree nested{{"a{b", Tree::list({Tree(Array::placeholder({2, 3}, DType::BFloat16)), Tree::dict()})},
                    {"1:", Array::placeholder({}, DType::Int32)}};
  const Tree back = compiler::tree_structure_from_text(compiler::tree_structure_text(nested));
  EXPECT_TRUE(back.same_structure(nested)) << compiler::tree_structure_text(nested);
  EXPECT_EQ(back.paths(), nested.paths());
  EXPECT_THROW(compiler::tree_structure_from_text("{1:a<f32:2>"), ValueError);
  // A list and a dict with the same leaves are different argument trees.
  const Tree as_list = Tree::list({Tree(Array::scalar(1.0f))});
  const Tree as_dict = Tree{{"0", Array::scalar(1.0f)}};
  EXPECT_NE(compiler::jit_index_key({}, as_list, "s", {false}).fingerprint(),
            compiler::jit_index_key({}, as_dict, "s", {false}).fingerprint());
}

// An index entry's body decoded (compilation_cache.cpp's format 2: length-prefixed
// strings), for forging entries that pass the hash check.
struct IndexBody {
  std::vector<std::pair<std::string, std::string>> key;
  std::string program, program_key_json, outputs;
};

// Rewrites an index entry's body (keeping the header valid): a forged entry that passes
// the hash check.
void rewrite_index_body(const fs::path& path, const std::function<void(IndexBody&)>& edit) {
  const std::string bytes = read_bytes(path);
  const size_t header = 8 + sizeof(uint32_t) + sizeof(uint64_t);
  size_t at = header;
  auto u64 = [&] {
    uint64_t n = 0;
    EXPECT_LE(at + sizeof(n), bytes.size());
    std::memcpy(&n, bytes.data() + at, sizeof(n));
    at += sizeof(n);
    return n;
  };
  auto str = [&] {
    const uint64_t n = u64();
    EXPECT_LE(at + n, bytes.size());
    std::string s = bytes.substr(at, n);
    at += n;
    return s;
  };
  IndexBody body;
  for (uint64_t parts = u64(), i = 0; i < parts; ++i) {
    std::string name = str();
    body.key.emplace_back(std::move(name), str());
  }
  body.program = str();
  body.program_key_json = str();
  body.outputs = str();
  EXPECT_EQ(at, bytes.size()) << "the whole body was decoded";
  edit(body);
  std::string text;
  auto put = [&](const std::string& s) {
    const uint64_t n = s.size();
    text.append(reinterpret_cast<const char*>(&n), sizeof(n));
    text += s;
  };
  const uint64_t parts = body.key.size();
  text.append(reinterpret_cast<const char*>(&parts), sizeof(parts));
  for (const auto& [name, value] : body.key) {
    put(name);
    put(value);
  }
  put(body.program);
  put(body.program_key_json);
  put(body.outputs);
  const uint64_t hash = XXH3_64bits(text.data(), text.size());
  std::string out = bytes.substr(0, 8 + sizeof(uint32_t));
  out.append(reinterpret_cast<const char*>(&hash), sizeof(hash));
  write_bytes(path, out + text);
}

TEST_F(CompilationIndexTest, DamagedDanglingOrForgedIndexEntriesFallBackToTracing) {
  const Tree args = step_args(3);
  const Tree want = run_indexed(args, with_identity("v1"));
  ASSERT_EQ(index_files(dir_).size(), 1u);
  const fs::path index = index_files(dir_)[0];

  struct Damage {
    std::string name;
    std::string warning;  // in the warning printed
    std::function<void()> apply;
  };
  const std::vector<Damage> damages = {
      {"flipped byte", "body hash mismatch",
       [&] {
         std::string b = read_bytes(index);
         b.back() ^= 0x20;
         write_bytes(index, b);
       }},
      {"truncated", "index format version", [&] { write_bytes(index, read_bytes(index).substr(0, 10)); }},
      {"not an index entry", "bad magic", [&] { write_bytes(index, "garbage that is no index entry"); }},
      {"dangling (its entry evicted)", "missing or damaged",
       [&] {
         for (const fs::path& e : entry_files(dir_)) fs::remove(e);
       }},
      {"another call's key", "key parts do not match",
       [&] {
         rewrite_index_body(index, [](IndexBody& b) {
           for (auto& [name, value] : b.key)
             if (name == "identity") value = "v0";
         });
       }},
      {"a program name that is no fingerprint", "not an index entry",
       [&] { rewrite_index_body(index, [](IndexBody& b) { b.program = "../" + b.program.substr(3); }); }},
      {"another program's key", "missing or damaged",
       [&] {
         rewrite_index_body(
             index, [](IndexBody& b) { b.program_key_json.replace(b.program_key_json.find("\"cpu\""), 5, "\"cpv\""); });
       }},
      {"forged output tree", "returns",
       [&] {
         rewrite_index_body(index, [](IndexBody& b) {
           b.outputs = compiler::tree_structure_text(Tree{{"loss", Array::placeholder({2}, DType::Float32)}});
         });
       }},
      {"outputs that are no tree", "unknown dtype",
       [&] { rewrite_index_body(index, [](IndexBody& b) { b.outputs = "{4:loss<f99:>}"; }); }},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    damage.apply();
    const auto before = compiler::compilation_cache_stats();
    ::testing::internal::CaptureStderr();
    const Tree got = run_indexed(args, with_identity("v1"));
    const std::string err = ::testing::internal::GetCapturedStderr();
    const auto after = compiler::compilation_cache_stats();
    EXPECT_EQ(traces_, 1) << "a damaged index entry falls back to tracing";
    EXPECT_EQ(after.index_corrupt - before.index_corrupt, 1u);
    EXPECT_EQ(after.index_hits, before.index_hits);
    EXPECT_NE(err.find("index entry"), std::string::npos) << err;
    EXPECT_NE(err.find(damage.warning), std::string::npos) << err;
    expect_bitwise(got, want, "after falling back");
    // The traced call rewrote the entry: the next call hits again.
    run_indexed(args, with_identity("v1"));
    EXPECT_EQ(traces_, 0);
  }
}

}  // namespace
}  // namespace tessera::test
