// The compilation cache's per-call index: a call with a cache identity found in it
// loads without tracing (bitwise the same results); another identity, shape, dtype,
// static argument, option or donation misses; a damaged, dangling or forged index
// entry falls back to tracing.
#include "api/jit_cache_index.h"
#include "compiler/compilation_cache_test_util.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::test {
namespace {

using compiler::CacheKey;
using compiler::CompilationCache;

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
