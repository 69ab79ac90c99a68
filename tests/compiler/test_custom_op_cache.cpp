// Custom ops and the persistent compilation cache: an entry written by a program with
// a custom op is reused by a fresh compile (and by the index, without tracing) while
// the op is registered; with the name unregistered, loading the entry is a clear miss
// (a warning naming the op; the entry is kept, not counted corrupt), never a crash.
#include "compiler/compilation_cache_test_util.h"
#include "tessera/compiler/executable.h"
#include "tessera/compiler/primitive_registry.h"
#include "tessera/core/custom_op.h"

namespace tessera::test {
namespace {

// y = x * k + 1 with k an attribute; registered and unregistered by the tests.
void register_scale_op() {
  CustomOpDefinition d;
  d.name = "test_cache_scale";
  d.num_inputs = 1;
  d.input_dtypes = {DType::Float32};
  d.infer = [](const std::vector<TensorSpec>& in, const CustomAttributes&) { return in; };
  d.cpu_kernel = [](const std::vector<InputBuffer>& in, const std::vector<OutputBuffer>& out,
                    const CustomAttributes& at) {
    const float k = static_cast<float>(attribute_double(at, "k", "test_cache_scale"));
    const float* x = in[0].as<const float>();
    float* y = out[0].as<float>();
    for (int64_t i = 0; i < in[0].numel(); ++i) y[i] = x[i] * k + 1.0f;
  };
  register_custom_op(std::move(d));
}

JitFn program() {
  return [](const Tree& args, const StaticArgs&) -> Tree {
    Array y = custom_op("test_cache_scale", {tanh(args.leaf())}, {{"k", 3.5}})[0];
    return Tree(sum(y));
  };
}

class CustomOpCacheTest : public CompilationCacheTest {
 protected:
  void SetUp() override {
    CompilationCacheTest::SetUp();
    unregister_custom_op("test_cache_scale");
    register_scale_op();
  }
  void TearDown() override {
    unregister_custom_op("test_cache_scale");
    CompilationCacheTest::TearDown();
  }
};

TEST_F(CustomOpCacheTest, EntryIsReusedByAFreshCompileWhenTheOpIsRegistered) {
  const Tree x(random_array({4, 8}, 1, DType::Float32));
  const auto s0 = compiler::compilation_cache_stats();
  const Tree cold = run_fresh(program(), x);
  const auto s1 = compiler::compilation_cache_stats();
  EXPECT_EQ(s1.stores - s0.stores, 1u);
  ASSERT_EQ(entry_files(dir_).size(), 1u);
  const Tree warm = run_fresh(program(), x);
  const auto s2 = compiler::compilation_cache_stats();
  EXPECT_EQ(s2.hits - s1.hits, 1u) << "the second compile loads the entry";
  EXPECT_EQ(s2.corrupt, s0.corrupt);
  expect_bitwise(warm, cold, "cache hit vs cold compile");
  // A different attribute is a different program: a miss, not a stale hit.
  const Tree other = run_fresh(
      [](const Tree& args, const StaticArgs&) -> Tree {
        return Tree(sum(custom_op("test_cache_scale", {tanh(args.leaf())}, {{"k", 2.0}})[0]));
      },
      x);
  EXPECT_EQ(entry_files(dir_).size(), 2u);
  EXPECT_NE(other.leaf().item<float>(), cold.leaf().item<float>());
}

TEST_F(CustomOpCacheTest, UnregisteredNameIsAClearMissNotACrash) {
  const Tree x(random_array({4, 8}, 2, DType::Float32));
  JitOptions options;
  options.cache_identity = "custom scale k=3.5";
  const Tree cold = run_fresh(program(), x, options);
  ASSERT_EQ(entry_files(dir_).size(), 1u);
  const std::string serialized = Jitted(program(), {}).lowered(x).executable().serialize();

  ASSERT_TRUE(unregister_custom_op("test_cache_scale"));
  // The executable bytes name the op; reading them back without it is a typed error.
  try {
    compiler::Executable::deserialize(serialized);
    ADD_FAILURE() << "deserialize must refuse an unregistered op";
  } catch (const compiler::UnregisteredOpError& e) {
    EXPECT_EQ(e.op(), "test_cache_scale");
    EXPECT_NE(std::string(e.what()).find("neither a built-in nor a registered custom op"), std::string::npos);
  }
  // Through jit: the index finds the entry, the entry needs the op, so the call misses
  // and traces; tracing calls custom_op, which says what is missing.
  const auto s0 = compiler::compilation_cache_stats();
  try {
    run_fresh(program(), x, options);
    ADD_FAILURE() << "the call must fail: the op is not registered";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no custom op named 'test_cache_scale'"), std::string::npos) << e.what();
  }
  const auto s1 = compiler::compilation_cache_stats();
  EXPECT_EQ(s1.index_misses - s0.index_misses, 1u);
  EXPECT_EQ(s1.corrupt, s0.corrupt) << "an unregistered op is not damage";
  EXPECT_EQ(s1.index_corrupt, s0.index_corrupt);
  EXPECT_EQ(entry_files(dir_).size(), 1u) << "the entry stays for processes that register the op";

  // Registered again (a process that links the op): the index and the entry serve it.
  register_scale_op();
  compiler::set_compilation_cache(dir_.string());
  Jitted again(program(), options);
  const Tree warm = again(x);
  EXPECT_EQ(again.trace_count(), 0) << "an index hit without tracing";
  expect_bitwise(warm, cold, "after registering again");
}

}  // namespace
}  // namespace tessera::test
