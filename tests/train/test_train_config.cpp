// The training config: TOML + --set overrides, checked against one schema.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tessera/base/error.h"
#include "tessera/train/config.h"

namespace tessera::train {
namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "configs/x.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainConfig, DefaultsAndValues) {
  TrainConfig c = parse_config(R"(
[model]
preset = "tiny"
layers = 2
[optimizer]
lr = 3e-4
no_decay = ["bias"]
[train]
steps = 50
batch = 8
micro_batch = 4
)",
                               "t.toml");
  EXPECT_EQ(c.model.family, "gpt2");
  EXPECT_EQ(c.model.dim, 256);   // from the preset
  EXPECT_EQ(c.model.layers, 2);  // the file overrides the preset
  EXPECT_DOUBLE_EQ(c.schedule.peak_lr, 3e-4);
  EXPECT_EQ(c.schedule.total_steps, 50);
  EXPECT_EQ(c.micro_batches(), 2);
  EXPECT_EQ(c.micro_batch_size(), 4);
  ASSERT_EQ(c.optimizer.no_decay.size(), 1u);
  EXPECT_EQ(c.optimizer.no_decay[0], nn::ParamKind::Bias);
}

TEST(TrainConfig, OverridesApplyAfterTheFile) {
  TrainConfig c = parse_config("[train]\nsteps = 10\n", "t.toml",
                               {"train.steps=20", "optimizer.lr=1e-2", "run.dir=runs/other", "model.dropout=0.1",
                                "data.sources=[\"a\", \"b\"]", "optimizer.nesterov=true"});
  EXPECT_EQ(c.loop.steps, 20);
  EXPECT_DOUBLE_EQ(c.schedule.peak_lr, 1e-2);
  EXPECT_EQ(c.run.dir, "runs/other");  // a bare word is a string
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.1);
  EXPECT_EQ(c.data.sources, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(c.optimizer.nesterov);
}

// A mesh of data, fsdp, tensor or expert axes runs on GPUs (docs/spmd.md, "On GPUs");
// pipeline stages run on the CPU only, and the config says so.
TEST(TrainConfig, GpuMeshesAreAcceptedPipelineStagesAreCpuOnly) {
  const std::string base = "[model]\npreset = \"tiny\"\n[train]\nbatch = 8\n[run]\ndevice = \"cuda\"\n";
  EXPECT_EQ(parse_config(base + "[parallel]\nmesh = \"data=2,tensor=2\"\n", "t.toml").parallel.mesh, "data=2,tensor=2");
  const std::string e = error_of(base + "[parallel]\nmesh = \"pipeline=2,data=2\"\n");
  EXPECT_NE(e.find("pipeline stages run on the CPU only"), std::string::npos) << e;
  EXPECT_NE(e.find("'parallel.mesh' = \"pipeline=2,data=2\" with 'run.device' = \"cuda\""), std::string::npos) << e;
}

TEST(TrainConfig, UnknownKeyNamesFileLineAndSuggests) {
  const std::string e = error_of("[train]\nsteps = 10\n\n[optimizer]\nlrr = 3e-4\n");
  EXPECT_NE(e.find("configs/x.toml:5"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'optimizer.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optimizer.lr'"), std::string::npos) << e;
}

TEST(TrainConfig, KeyInTheWrongSectionSuggestsTheRightOne) {
  const std::string e = error_of("[optimizer]\nwarmup_steps = 10\n");
  EXPECT_NE(e.find("configs/x.toml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("schedule.warmup_steps"), std::string::npos) << e;
}

TEST(TrainConfig, UnknownSectionAndTopLevelKey) {
  EXPECT_NE(error_of("[optimiser]\nlr = 1\n").find("did you mean 'optimizer.lr'"), std::string::npos);
  EXPECT_NE(error_of("steps = 3\n").find("configs/x.toml:1"), std::string::npos);
}

TEST(TrainConfig, WrongTypeNamesKeyAndLine) {
  const std::string e = error_of("[train]\nbatch = \"eight\"\n");
  EXPECT_NE(e.find("configs/x.toml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("'train.batch' expects an integer"), std::string::npos) << e;
  EXPECT_NE(error_of("[train]\nsteps = 1.5\n").find("expects an integer"), std::string::npos);
  EXPECT_NE(error_of("[model]\ndropout = true\n").find("expects a number"), std::string::npos);
}

TEST(TrainConfig, BadOverrides) {
  EXPECT_NE(error_of("", {"train.stepz=3"})
                .find("--set train.stepz=3: unknown key 'train.stepz' (did you mean "
                      "'train.steps'?)"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.steps=abc"}).find("--set train.steps=abc: 'train.steps' expects an integer"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.steps"}).find("expected section.key=value"), std::string::npos);
}

// A bare-word value is taken as a string without TOML's UTF-8 check; invalid bytes would
// reach the checkpoint manifest, whose JSON writer throws on them (found by fuzz_config).
TEST(TrainConfig, OverrideMustBeUtf8) {
  const std::string e = error_of("", {"run.dir=runs/\x8e\x8a"});
  EXPECT_NE(e.find("--set run.dir=runs/"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid UTF-8 (byte 0x8e at offset 13; expected text)"), std::string::npos) << e;
  EXPECT_NE(error_of("", {"run.dir=\xed\xa0\x80"}).find("byte 0xed at offset 8"), std::string::npos);  // a surrogate
  EXPECT_NE(error_of("", {"run.dir=\xc0\xaf"}).find("byte 0xc0 at offset 8"), std::string::npos);      // overlong
  EXPECT_EQ(parse_config("", "x.toml", {"run.dir=runs/caf\xc3\xa9-\xf0\x9f\x99\x82"}).run.dir, "runs/café-🙂");
}

TEST(TrainConfig, SyntaxErrorHasLineAndColumn) {
  const std::string e = error_of("[train]\nsteps = = 3\n");
  EXPECT_NE(e.find("configs/x.toml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("TOML syntax error"), std::string::npos) << e;
}

TEST(TrainConfig, CrossFieldChecks) {
  EXPECT_NE(error_of("[train]\nbatch = 8\nmicro_batch = 3\n").find("must divide 'train.batch'"), std::string::npos);
  EXPECT_NE(error_of("[train]\nseq = 512\n").find("exceeds 'model.context'"), std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"huge\"\n").find("model.preset"), std::string::npos);
  EXPECT_NE(error_of("[model]\ndim = 250\nheads = 4\n").find("config:"), std::string::npos);
}

TEST(TrainConfig, MissingFileIsAConfigError) {
  try {
    load_config("/nonexistent/x.toml");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.toml"), std::string::npos);
  }
}

TEST(TrainConfig, JsonRoundTrip) {
  TrainConfig c = parse_config("[model]\npreset = \"llama-tiny\"\n[train]\nsteps = 7\n", "t.toml",
                               {"optimizer.no_decay=[\"norm\"]", "data.sources=[\"x\"]"});
  TrainConfig back = config_from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.model.family, "llama");
  EXPECT_EQ(back.loop.steps, 7);
}

TEST(TrainConfig, DataMixtureTablesRoundTripAndAreChecked) {
  const std::string text = R"([data]
packing = "concat"
workers = 3
[[data.mixture]]
path = "web/"
weight = 0.7
[[data.mixture]]
name = "notes"
path = "notes.txt"
kind = "text"
weight = 3
[[data.mixture]]
path = "code.bin"
documents = 10
)";
  const TrainConfig c = parse_config(text, "m.toml");
  ASSERT_EQ(c.data.pipeline.sources.size(), 3u);
  EXPECT_TRUE(c.data.uses_pipeline());
  EXPECT_EQ(c.data.pipeline.sources[0].path, "web/");
  EXPECT_DOUBLE_EQ(c.data.pipeline.sources[0].weight, 0.7);
  EXPECT_EQ(c.data.pipeline.sources[1].name, "notes");
  EXPECT_EQ(c.data.pipeline.sources[1].kind, "text");
  EXPECT_DOUBLE_EQ(c.data.pipeline.sources[1].weight, 3.0);
  EXPECT_EQ(c.data.pipeline.sources[2].documents, "10");
  EXPECT_EQ(c.data.pipeline.packing, "concat");
  EXPECT_EQ(c.data.pipeline.workers, 3);
  const TrainConfig back = config_from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.data.pipeline.fingerprint(), c.data.pipeline.fingerprint());
  // As an override, with inline tables.
  const TrainConfig o = parse_config("", "t", {"data.mixture=[{path = \"a.bin\", weight = 2}, {path = \"b\"}]"});
  ASSERT_EQ(o.data.pipeline.sources.size(), 2u);
  EXPECT_DOUBLE_EQ(o.data.pipeline.sources[1].weight, 1.0);
  EXPECT_FALSE(parse_config("", "t").data.uses_pipeline());

  EXPECT_NE(error_of("[[data.mixture]]\npath = \"a\"\nweight = 0\n[[data.mixture]]\npath = \"b\"\nweight = 0\n")
                .find("weights sum to 0"),
            std::string::npos);
  EXPECT_NE(error_of("[[data.mixture]]\npath = \"a\"\nweight = -1\n").find("weight -1"), std::string::npos);
  // A source without a path reads data.train, overrides included.
  const TrainConfig pathless = parse_config("[[data.mixture]]\nname = \"main\"\n", "t", {"data.train=\"x.bin\""});
  EXPECT_EQ(pathless.data.pipeline.sources[0].path, "");
  EXPECT_EQ(pathless.data.resolved_pipeline().sources[0].path, "x.bin");
  EXPECT_NE(error_of("[[data.mixture]]\npath = \"a\"\nwieght = 1\n").find("unknown key 'wieght'"), std::string::npos);
  EXPECT_NE(error_of("[data]\nmixture = \"a.bin\"\n").find("expects a list of sources"), std::string::npos);
  EXPECT_NE(error_of("[[data.mixture]]\npath = \"a\"\n[data]\npacking = \"bins\"\n").find("'bins'"), std::string::npos);
}

// A checkpoint manifest's extra.config of the wrong shape (damage, found by fuzz_manifest)
// is a ConfigError naming the key, never a JSON or TOML library error that escapes resume.
std::string json_error_of(const nlohmann::json& json) {
  try {
    config_from_json(json);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainConfig, DamagedJsonIsAConfigError) {
  EXPECT_NE(json_error_of({{"model", {{"preset", 5}}}}).find("'model.preset' is 5 (expected a string)"),
            std::string::npos);
  EXPECT_NE(json_error_of({{"optimizer", {{"lr", nullptr}}}}).find("key 'optimizer.lr' is null (not a TOML value"),
            std::string::npos);
  EXPECT_NE(json_error_of(nlohmann::json::parse(R"({"train": {"steps": {"a": 1}}})")).find("key 'train.steps'"),
            std::string::npos);
  EXPECT_NE(json_error_of({{"train", 3}}).find("section 'train' is number (expected an object of keys)"),
            std::string::npos);
  EXPECT_NE(json_error_of(nlohmann::json::array()).find("expected an object of sections (got array)"),
            std::string::npos);
}

TEST(TrainConfig, RopeScalingKeysRoundTripAndAreChecked) {
  TrainConfig c = parse_config(R"(
[model]
preset = "llama-tiny"
rope_scaling = "llama3"
rope_factor = 32
rope_low_freq_factor = 0.5
rope_high_freq_factor = 2.5
rope_original_context = 64
)",
                               "t.toml");
  EXPECT_EQ(c.model.rope_scaling, "llama3");
  EXPECT_EQ(c.model.rope_factor, 32.0);
  EXPECT_EQ(c.model.rope_low_freq_factor, 0.5);
  EXPECT_EQ(c.model.rope_high_freq_factor, 2.5);
  EXPECT_EQ(c.model.rope_original_context, 64);
  const TrainConfig back = config_from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.model.rope_scaling, "llama3");
  EXPECT_EQ(back.model.rope_original_context, 64);
  // A checkpoint written before these keys existed restores plain RoPE.
  nlohmann::json old = c.to_json();
  for (const char* key :
       {"rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context"})
    old["model"].erase(key);
  EXPECT_EQ(config_from_json(old).model.rope_scaling, "none");
  EXPECT_NE(error_of("[model]\npreset = \"llama-tiny\"\nrope_scaling = \"yarn\"\n").find("rope_scaling = 'yarn'"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"llama-tiny\"\nrope_factor = 0.0\n").find("rope_factor = 0"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nrope_original_context = 1.5\n").find("'model.rope_original_context' expects an integer"),
            std::string::npos);
}

TEST(TrainConfig, EveryShippedConfigLoads) {
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(TESSERA_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".toml" || entry.path().filename() == "accelerators.toml") continue;
    EXPECT_NO_THROW(load_config(entry.path())) << entry.path();
    ++loaded;
  }
  EXPECT_GE(loaded, 4);
}

TEST(TrainConfig, EditDistance) {
  EXPECT_EQ(edit_distance("lrr", "lr"), 1u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
}

TEST(TrainConfig, ModelRematKey) {
  EXPECT_EQ(parse_config("", "t").model.remat, "none");
  EXPECT_EQ(parse_config("[model]\nremat = \"offload\"\n", "t").model.remat, "offload");
  EXPECT_EQ(parse_config("", "t", {"model.remat=full"}).model.remat, "full");
  const std::string unknown = error_of("[model]\nremat = \"host\"\n");
  EXPECT_NE(unknown.find("configs/x.toml:2"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'model.remat' = \"host\" is unknown (expected one of: none, full, offload"),
            std::string::npos)
      << unknown;
  EXPECT_NE(error_of("", {"model.remat=true"}).find("a string"), std::string::npos);
  TrainConfig c;
  c.model.remat = "offload[block_input]";
  try {
    c.validate();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.remat'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::train
