// The persistent compilation cache: jit stores and reloads executables with bitwise
// identical results, keys are canonical and name what changed, damaged entries are
// recompiled, an unusable directory only warns, the size bound evicts least recently
// used entries, and concurrent writers of one key leave a valid entry. (The per-call
// index: test_compilation_cache_index.cpp.)
#include "compiler/compilation_cache_test_util.h"

namespace tessera::test {
namespace {

using compiler::CacheKey;
using compiler::CompilationCache;

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
  // (Not a structured binding: clang 14 cannot capture one in the lambdas below.)
  auto keyed = program("shared", 2.0f);
  const auto& key = keyed.first;
  const auto& exe = keyed.second;
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
    auto keyed = program("first_store", 3.0f);  // (as above)
    const auto& key = keyed.first;
    const auto& exe = keyed.second;
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

}  // namespace
}  // namespace tessera::test
