// Writing Hugging Face model directories: export -> import round trips (bitwise, both
// families, sharded, bfloat16), config.json fields, and bad input: wrong or missing or
// extra tensors, broken indexes, safetensors headers that lie; a failed export leaves
// nothing at its target.
#include <gtest/gtest.h>

#include <cstring>

#include "hf_test_util.h"
#include "tessera/base/error.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/interop/hf_checkpoint.h"
#include "tessera/interop/hf_config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

models::ModelConfig gpt2_config() {
  return {.family = "gpt2", .vocab = 50, .dim = 24, .layers = 2, .heads = 3, .context = 16};
}

models::ModelConfig llama_config() {
  return {.family = "llama",
          .vocab = 40,
          .dim = 32,
          .layers = 2,
          .heads = 4,
          .kv_heads = 2,
          .mlp_dim = 48,
          .context = 16,
          .norm_eps = 1e-6,
          .rope_theta = 5000.0};
}

// Llama 3.1's RoPE scaling on llama_config().
models::ModelConfig llama31_config() {
  models::ModelConfig c = llama_config();
  c.rope_scaling = "llama3";
  c.rope_factor = 32.0;
  c.rope_low_freq_factor = 0.5;
  c.rope_high_freq_factor = 2.5;
  c.rope_original_context = 8;
  return c;
}

// Runs `fn`, expects an Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error (expected one mentioning " << parts.at(0) << ")";
  } catch (const Error& e) {
    for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(HfExport, RoundTripIsBitwiseForBothFamilies) {
  const fs::path dir = test::hf_test_dir();
  for (const models::ModelConfig& config : {gpt2_config(), llama_config(), llama31_config()}) {
    for (bool tied : {false, true}) {
      models::ModelConfig c = config;
      c.tied_embeddings = tied;
      const Tree params = test::random_params(c, 7);
      const fs::path out = dir / fmt::format("{}_{}_{}", c.family, c.rope_scaling, tied);
      interop::save_hf_model(out, c, params);
      EXPECT_TRUE(fs::exists(out / "model.safetensors"));
      EXPECT_EQ(fs::exists(out / "model.safetensors.index.json"), false);
      const interop::HfModel back = interop::load_hf_model(out);
      EXPECT_EQ(back.config.family, c.family);
      EXPECT_EQ(back.config.resolved_tied(), tied);
      EXPECT_EQ(back.config.rope_scaling, c.rope_scaling);
      test::expect_trees_bitwise_equal(back.params, params);
      // The model computes the same logits from the re-imported tree.
      const Array tokens = Array::from_vector(std::vector<int32_t>{1, 5, 9, 3}, {1, 4});
      EXPECT_EQ(models::Model(c).logits(params, tokens).to_vector<float>(),
                models::Model(back.config).logits(back.params, tokens).to_vector<float>());
    }
  }
}

TEST(HfExport, ImportedFixtureReExportsToTheSameTensors) {
  // Fixture -> tessera -> HF: every tensor transformers wrote comes back bit for bit.
  const fs::path dir = test::hf_test_dir();
  for (const char* name : {"hf_gpt2", "hf_llama", "hf_llama31", "hf_mixtral"}) {
    const interop::HfModel hf = interop::load_hf_model(test::kHfFixtures / name);
    interop::save_hf_model(dir / name, hf.config, hf.params);
    const interop::HfTensors original = interop::read_hf_tensors(test::kHfFixtures / name);
    const interop::HfTensors exported = interop::read_hf_tensors(dir / name);
    ASSERT_EQ(original.size(), exported.size()) << name;
    for (const auto& [tensor, t] : original) {
      ASSERT_TRUE(exported.count(tensor)) << tensor;
      const Array& a = t.array;
      const Array& b = exported.at(tensor).array;
      ASSERT_EQ(a.shape(), b.shape()) << tensor;
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << tensor;
    }
  }
}

TEST(HfExport, ShardedExportFollowsTransformersLayout) {
  const fs::path dir = test::hf_test_dir();
  const models::ModelConfig c = llama_config();
  const Tree params = test::random_params(c, 3);
  interop::HfSaveOptions options;
  options.max_shard_bytes = interop::parse_byte_size("10KB");
  interop::save_hf_model(dir / "out", c, params, options);
  const json index = test::read_json_file(dir / "out/model.safetensors.index.json");
  std::set<std::string> files;
  uint64_t total = 0;
  for (const auto& [name, file] : index.at("weight_map").items()) files.insert(file.get<std::string>());
  ASSERT_GT(files.size(), 2u);
  for (const std::string& file : files) {
    EXPECT_TRUE(fs::exists(dir / "out" / file)) << file;
    EXPECT_NE(file.find(fmt::format("-of-{:05d}.safetensors", files.size())), std::string::npos) << file;
    for (const auto& entry : ckpt::read_safetensors_header(dir / "out" / file).tensors) {
      total += entry.end - entry.begin;
      EXPECT_LE(entry.end - entry.begin, 10'000u);
    }
  }
  EXPECT_TRUE(files.count("model-00001-of-" + fmt::format("{:05d}", files.size()) + ".safetensors"));
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  EXPECT_FALSE(fs::exists(dir / "out/model.safetensors"));
  test::expect_trees_bitwise_equal(interop::load_hf_model(dir / "out").params, params);
}

TEST(HfExport, BFloat16ExportRoundsOnceAndReimportsExactly) {
  const fs::path dir = test::hf_test_dir();
  const models::ModelConfig c = gpt2_config();
  const Tree params = test::random_params(c, 5);
  interop::HfSaveOptions options;
  options.dtype = DType::BFloat16;
  interop::save_hf_model(dir / "bf16", c, params, options);
  for (const auto& entry : ckpt::read_safetensors_header(dir / "bf16/model.safetensors").tensors)
    EXPECT_EQ(entry.dtype, DType::BFloat16) << entry.name;
  EXPECT_EQ(test::read_json_file(dir / "bf16/config.json").at("torch_dtype"), "bfloat16");
  // Import gives float32 values equal to the bfloat16 rounding of the originals.
  const Tree rounded = params.map([](const Array& a) { return astype(astype(a, DType::BFloat16), DType::Float32); });
  const interop::HfModel back = interop::load_hf_model(dir / "bf16");
  test::expect_trees_bitwise_equal(back.params, rounded.map([](const Array& a) { return a.eval(); }));
  // And a second export of those (now exactly representable) values changes nothing.
  interop::save_hf_model(dir / "bf16_again", back.config, back.params, options);
  EXPECT_EQ(test::read_text(dir / "bf16/model.safetensors"), test::read_text(dir / "bf16_again/model.safetensors"));
}

TEST(HfExport, ConfigJsonFieldsReadBack) {
  const fs::path dir = test::hf_test_dir();
  const models::ModelConfig c = llama_config();
  interop::HfSaveOptions options;
  options.bos_token_id = 1;
  options.eos_token_id = 2;
  interop::save_hf_model(dir / "out", c, test::random_params(c, 1), options);
  const json j = test::read_json_file(dir / "out/config.json");
  EXPECT_EQ(j.at("architectures"), json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j.at("model_type"), "llama");
  EXPECT_EQ(j.at("vocab_size"), 40);
  EXPECT_EQ(j.at("hidden_size"), 32);
  EXPECT_EQ(j.at("intermediate_size"), 48);
  EXPECT_EQ(j.at("num_hidden_layers"), 2);
  EXPECT_EQ(j.at("num_attention_heads"), 4);
  EXPECT_EQ(j.at("num_key_value_heads"), 2);
  EXPECT_EQ(j.at("max_position_embeddings"), 16);
  EXPECT_EQ(j.at("rms_norm_eps"), 1e-6);
  EXPECT_EQ(j.at("rope_theta"), 5000.0);
  EXPECT_EQ(j.at("tie_word_embeddings"), false);
  EXPECT_EQ(j.at("torch_dtype"), "float32");
  EXPECT_EQ(j.at("bos_token_id"), 1);
  EXPECT_EQ(j.at("eos_token_id"), 2);
  const models::ModelConfig back = interop::model_config_from_hf(j, "config.json");
  EXPECT_EQ(back.mlp_dim, 48);
  EXPECT_EQ(back.kv_heads, 2);
  EXPECT_EQ(back.context, 16);
  EXPECT_TRUE(j.at("rope_scaling").is_null());

  // Llama 3.1 scaling: transformers 4's rope_scaling form, which transformers 5 reads too.
  interop::save_hf_model(dir / "llama31", llama31_config(), test::random_params(llama31_config(), 1));
  const json s = test::read_json_file(dir / "llama31/config.json");
  EXPECT_EQ(s.at("rope_theta"), 5000.0);
  EXPECT_EQ(s.at("rope_scaling"), json({{"rope_type", "llama3"},
                                        {"factor", 32.0},
                                        {"low_freq_factor", 0.5},
                                        {"high_freq_factor", 2.5},
                                        {"original_max_position_embeddings", 8}}));
  const models::ModelConfig scaled = interop::model_config_from_hf(s, "config.json");
  EXPECT_EQ(scaled.rope_scaling, "llama3");
  EXPECT_EQ(scaled.rope_factor, 32.0);
  EXPECT_EQ(scaled.rope_low_freq_factor, 0.5);
  EXPECT_EQ(scaled.rope_high_freq_factor, 2.5);
  EXPECT_EQ(scaled.rope_original_context, 8);

  interop::save_hf_model(dir / "gpt2", gpt2_config(), test::random_params(gpt2_config(), 1));
  const json g = test::read_json_file(dir / "gpt2/config.json");
  EXPECT_EQ(g.at("architectures"), json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(g.at("n_embd"), 24);
  EXPECT_EQ(g.at("n_head"), 3);
  EXPECT_EQ(g.at("n_positions"), 16);
  EXPECT_EQ(g.at("activation_function"), "gelu_new");
  EXPECT_EQ(g.at("tie_word_embeddings"), true);
  EXPECT_TRUE(g.at("bos_token_id").is_null());  // unknown: null, not transformers' GPT-2 default 50256
}

TEST(HfExport, FailedExportLeavesNothingAtTheTarget) {
  const fs::path dir = test::hf_test_dir();
  const models::ModelConfig c = gpt2_config();
  Tree params = test::random_params(c, 1);
  params["wte"] = Array::from_vector(std::vector<float>(10, 0.0f), {2, 5});  // wrong shape
  expect_error([&] { interop::save_hf_model(dir / "bad", c, params); },
               {"'wte'", "[2, 5]", "[128, 24]"});  // the padded table
  EXPECT_FALSE(fs::exists(dir / "bad"));
  // A tokenizer file that does not exist fails the export before anything is written.
  interop::HfSaveOptions options;
  options.extra_files = {{dir / "missing.json", "tokenizer.json"}};
  expect_error([&] { interop::save_hf_model(dir / "bad", c, test::random_params(c, 1), options); },
               {"missing.json", "not found"});
  // A target that exists and is not empty is refused, and left as it was.
  fs::create_directories(dir / "full");
  std::ofstream(dir / "full/keep.txt") << "x";
  expect_error([&] { interop::save_hf_model(dir / "full", c, test::random_params(c, 1)); }, {"already exists"});
  EXPECT_TRUE(fs::exists(dir / "full/keep.txt"));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

// A copy of the single-file fixture whose tensors are changed by `edit` and written back.
fs::path edited_fixture(const fs::path& dir, const std::string& name,
                        const std::function<void(std::map<std::string, Array>&)>& edit) {
  const fs::path out = test::copy_fixture(name, dir);
  ckpt::SafetensorsFile file = ckpt::read_safetensors(out / "model.safetensors");
  edit(file.tensors);
  ckpt::write_safetensors(out / "model.safetensors", file.tensors, file.metadata);
  return out;
}

TEST(HfImportErrors, WrongShapeNamesTensorFileAndBothShapes) {
  const fs::path out = edited_fixture(test::hf_test_dir(), "hf_llama", [](auto& t) {
    t["model.layers.1.self_attn.k_proj.weight"] = Array::from_vector(std::vector<float>(8 * 32, 0.5f), {8, 32});
  });
  expect_error([&] { interop::load_hf_model(out); },
               {"model.layers.1.self_attn.k_proj.weight", "model.safetensors", "[8, 32]", "expected [16, 32]"});
}

TEST(HfImportErrors, MissingTensorIsNamed) {
  const fs::path out =
      edited_fixture(test::hf_test_dir(), "hf_gpt2", [](auto& t) { t.erase("transformer.h.1.mlp.c_fc.bias"); });
  expect_error([&] { interop::load_hf_model(out); }, {"'transformer.h.1.mlp.c_fc.bias' is missing", "[128]"});
}

TEST(HfImportErrors, UnexpectedTensorIsNamed) {
  const fs::path out = edited_fixture(test::hf_test_dir(), "hf_llama", [](auto& t) {
    t["model.layers.2.mlp.up_proj.weight"] = Array::from_vector(std::vector<float>(4, 0.0f), {2, 2});
  });
  expect_error([&] { interop::load_hf_model(out); }, {"unexpected tensor", "'model.layers.2.mlp.up_proj.weight'"});
}

TEST(HfImportErrors, TiedHeadThatDiffersFromTheEmbedding) {
  const fs::path out = edited_fixture(test::hf_test_dir(), "hf_gpt2", [](auto& t) {
    t["lm_head.weight"] = (t.at("transformer.wte.weight") + 1.0).eval();
  });
  expect_error([&] { interop::load_hf_model(out); }, {"'lm_head.weight' differs", "tie_word_embeddings"});
  // A head equal to the embedding (as some exporters write it) is fine.
  const fs::path same = edited_fixture(test::hf_test_dir("same"), "hf_gpt2",
                                       [](auto& t) { t["lm_head.weight"] = t.at("transformer.wte.weight"); });
  EXPECT_NO_THROW(interop::load_hf_model(same));
}

TEST(HfImportErrors, IndexProblemsAreNamed) {
  const fs::path dir = test::hf_test_dir();
  auto with_index = [&](const std::string& tag, const std::function<void(json&)>& edit) {
    const fs::path out = dir / tag;
    fs::create_directories(out);
    fs::copy(test::kHfFixtures / "hf_llama_sharded", out, fs::copy_options::recursive);
    json index = test::read_json_file(out / "model.safetensors.index.json");
    edit(index);
    fs::permissions(out / "model.safetensors.index.json", fs::perms::owner_read | fs::perms::owner_write);
    std::ofstream(out / "model.safetensors.index.json") << index.dump(2);
    return out;
  };
  fs::path out = with_index("missing_shard",
                            [](json& j) { j["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors"; });
  expect_error([&] { interop::load_hf_model(out); },
               {"'model.norm.weight'", "model-00009-of-00009.safetensors", "does not exist"});
  out = with_index("unlisted", [](json& j) { j["weight_map"].erase("model.norm.weight"); });
  expect_error([&] { interop::load_hf_model(out); }, {"holds tensor 'model.norm.weight'", "does not list"});
  out = with_index(
      "absent", [](json& j) { j["weight_map"]["model.layers.0.extra.weight"] = j["weight_map"]["model.norm.weight"]; });
  expect_error([&] { interop::load_hf_model(out); }, {"'model.layers.0.extra.weight'", "does not hold it"});
  out = with_index(
      "moved", [](json& j) { j["weight_map"]["model.norm.weight"] = j["weight_map"]["model.embed_tokens.weight"]; });
  expect_error([&] { interop::load_hf_model(out); }, {"'model.norm.weight'", "maps to"});
}

TEST(HfImportErrors, HeaderLyingAboutOffsetsNamesTheFile) {
  const fs::path out = test::copy_fixture("hf_llama", test::hf_test_dir());
  const fs::path file = out / "model.safetensors";
  std::string bytes = test::read_text(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  // The first tensor claims 64 bytes more than it has: offsets overlap the next one.
  json& entry = header["model.embed_tokens.weight"];
  entry["data_offsets"][1] = entry["data_offsets"][1].get<uint64_t>() + 64;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t m = text.size();
  std::string patched(reinterpret_cast<const char*>(&m), 8);
  patched += text + bytes.substr(8 + n);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << patched;
  expect_error([&] { interop::load_hf_model(out); }, {file.string(), "model.embed_tokens.weight"});
}

TEST(HfImportErrors, DirectoriesWithoutAModel) {
  const fs::path dir = test::hf_test_dir();
  expect_error([&] { interop::load_hf_model(dir); }, {"no config.json"});
  std::ofstream(dir / "config.json") << test::read_text(test::kHfFixtures / "hf_gpt2/config.json");
  expect_error([&] { interop::load_hf_model(dir); }, {"no model.safetensors or model.safetensors.index.json"});
  std::ofstream(dir / "pytorch_model.bin") << "pickle";
  expect_error([&] { interop::load_hf_model(dir); }, {"pytorch_model.bin", "only safetensors"});
}

// config.json with a number past double's range: the JSON library's out_of_range, not a
// parse_error (found by fuzz_hf_weights), reported like any other invalid JSON.
TEST(HfImportErrors, ConfigNumberOverflowIsInvalidJson) {
  const fs::path dir = test::hf_test_dir();
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "n_embd": 1e999})";
  expect_error([&] { interop::load_hf_model(dir); },
               {"config.json: not valid JSON", "number overflow parsing '1e999'"});
}

TEST(HfExport, ByteSizesParseLikeTransformers) {
  EXPECT_EQ(interop::parse_byte_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(interop::parse_byte_size("20KB"), 20'000u);
  EXPECT_EQ(interop::parse_byte_size("1.5MB"), 1'500'000u);
  EXPECT_EQ(interop::parse_byte_size("2GiB"), 2147483648u);
  EXPECT_EQ(interop::parse_byte_size("123"), 123u);
  expect_error([] { interop::parse_byte_size("5 parsecs"); }, {"'5 parsecs' is not understood"});
  expect_error([] { interop::parse_byte_size("GB"); }, {"not understood"});
}

}  // namespace
}  // namespace tessera
