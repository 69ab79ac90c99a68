// The training stack from Python: the TOML config (one schema with `tessera train`),
// models, the optimizer and schedule, checkpoints, tokenizers, and the Trainer.
#include <fmt/format.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/shared_ptr.h>

#include "bindings.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/optim/schedule.h"
#include "tessera/train/config.h"
#include "tessera/train/trainer.h"
#include "trees.h"

namespace tessera::python {
namespace {

// A config from TOML text plus "section.key=value" overrides (ConfigError naming the
// key, with a suggestion, for a bad one).
train::TrainConfig parse(const std::string& toml, const std::string& origin,
                         const std::vector<std::string>& overrides) {
  return train::parse_config(toml, origin, overrides);
}

nb::dict summary_dict(const train::TrainSummary& s) {
  nb::dict d;
  d["start_step"] = s.start_step;
  d["end_step"] = s.end_step;
  d["stop_reason"] = s.stop_reason;
  d["train_seconds"] = s.train_seconds;
  d["tokens_per_s"] = s.tokens_per_s;
  d["mfu"] = s.mfu;
  d["peak_flops"] = s.peak_flops;
  d["peak_source"] = s.peak_source;
  d["last_loss"] = s.last_loss;
  d["val_loss"] = s.val_loss ? nb::cast(*s.val_loss) : nb::none();
  d["last_checkpoint"] = s.last_checkpoint.string();
  d["parameters"] = s.parameters;
  d["optimizer"] = s.optimizer;
  d["optimizer_state_bytes"] = s.optimizer_state_bytes;
  d["goodput_table"] = s.goodput_table;
  d["parallel_summary"] = s.parallel_summary;
  return d;
}

// One Trainer per fit() (a Trainer runs once); the params of the last run stay readable.
struct PyTrainer {
  train::TrainConfig config;
  std::shared_ptr<train::Trainer> last;
};

// Packed documents (Model::logits / loss): segment ids and in-document positions, both
// int32 [B, T], or neither.
std::optional<models::Packing> packing(nb::handle segment_ids, nb::handle positions, const char* method) {
  if (segment_ids.is_none() && positions.is_none()) return std::nullopt;
  if (segment_ids.is_none() || positions.is_none())
    throw nb::value_error(fmt::format("Model.{}: packed documents need both segment_ids and positions (got only {})",
                                      method, segment_ids.is_none() ? "positions" : "segment_ids")
                              .c_str());
  return models::Packing{as_array(segment_ids, "segment_ids"), as_array(positions, "positions")};
}

}  // namespace

void register_training(nb::module_& m) {
  nb::class_<train::TrainConfig>(m, "_Config")
      .def("to_json", [](const train::TrainConfig& c) { return c.to_json().dump(); })
      .def("validate", &train::TrainConfig::validate);
  m.def("_parse_config", &parse, nb::arg("toml"), nb::arg("origin"), nb::arg("overrides"));
  m.def("_load_config", [](const std::filesystem::path& path, const std::vector<std::string>& overrides) {
    return train::load_config(path, overrides);
  });
  m.def("_describe_config_keys", &train::describe_config_keys);

  nb::class_<models::Model>(m, "_Model")
      .def("__init__", [](models::Model* self, const train::TrainConfig& c) { new (self) models::Model(c.model); })
      .def(
          "init", [](const models::Model& model, uint64_t seed) { return from_tree(model.init(seed)); },
          nb::arg("seed"))
      .def(
          "loss",
          [](const models::Model& model, nb::handle params, nb::handle tokens, nb::handle targets, nb::handle key,
             nb::handle segment_ids, nb::handle positions) {
            return model.loss(to_tree(params), as_array(tokens, "loss: tokens"), as_array(targets, "loss: targets"),
                              as_optional_array(key, "loss: dropout_key"), packing(segment_ids, positions, "loss"));
          },
          nb::arg("params"), nb::arg("tokens"), nb::arg("targets"), nb::arg("dropout_key").none() = nb::none(),
          nb::arg("segment_ids").none() = nb::none(), nb::arg("positions").none() = nb::none())
      .def(
          "logits",
          [](const models::Model& model, nb::handle params, nb::handle tokens, nb::handle key, nb::handle segment_ids,
             nb::handle positions) {
            return model.logits(to_tree(params), as_array(tokens, "logits: tokens"),
                                as_optional_array(key, "logits: dropout_key"),
                                packing(segment_ids, positions, "logits"));
          },
          nb::arg("params"), nb::arg("tokens"), nb::arg("dropout_key").none() = nb::none(),
          nb::arg("segment_ids").none() = nb::none(), nb::arg("positions").none() = nb::none())
      .def_prop_ro("parameter_count", &models::Model::parameter_count)
      .def_prop_ro("vocab", [](const models::Model& model) { return model.config().vocab; })
      .def_prop_ro("context", [](const models::Model& model) { return model.config().context; });
  m.def("_preset_names", &models::preset_names);

  nb::class_<optim::Optimizer>(m, "_Optimizer")
      .def("__init__",
           [](optim::Optimizer* self, const train::TrainConfig& c, const models::Model& model) {
             new (self) optim::Optimizer(c.optimizer_config(), model.specs());
           })
      .def("init", [](const optim::Optimizer& opt, nb::handle params) { return from_tree(opt.init(to_tree(params))); })
      .def("apply",
           [](const optim::Optimizer& opt, nb::handle params, nb::handle grads, nb::handle state, nb::handle lr) {
             optim::Optimizer::Update u = opt.apply(to_tree(params, "params"), to_tree(grads, "grads"),
                                                    to_tree(state, "state"), as_array(lr, "lr"));
             return nb::make_tuple(from_tree(u.params), from_tree(u.state), u.grad_norm);
           });
  m.def("_learning_rate",
        [](const train::TrainConfig& c, int64_t step) { return optim::learning_rate(c.schedule, step); });
  m.def(
      "global_norm", [](nb::handle grads) { return optim::global_norm(to_tree(grads, "grads")); }, nb::arg("grads"),
      "The global L2 norm of every leaf of a pytree (a 0-d float32 array).");
  m.def(
      "clip_by_global_norm",
      [](nb::handle grads, double max_norm) {
        auto [clipped, norm] = optim::clip_by_global_norm(to_tree(grads, "grads"), max_norm);
        return nb::make_tuple(from_tree(clipped), norm);
      },
      nb::arg("grads"), nb::arg("max_norm"), "(grads scaled to a global norm of at most max_norm, the norm before).");

  // Checkpoints: one safetensors file of a pytree (names: dotted paths), and the run
  // directory's atomic, verified checkpoints.
  m.def(
      "_save_safetensors",
      [](const std::filesystem::path& path, nb::handle tree) {
        Tree t = to_tree(tree);
        std::map<std::string, Array> tensors;
        const std::vector<Array> leaves = t.leaves();
        const std::vector<std::string> paths = t.paths();
        for (size_t i = 0; i < leaves.size(); ++i) tensors.emplace(paths[i], leaves[i]);
        nb::gil_scoped_release release;
        // Written beside the target, then renamed over it: a crash leaves the old file.
        const std::filesystem::path partial = path.parent_path() / ("." + path.filename().string() + ".partial");
        ckpt::write_safetensors(partial, tensors);
        std::filesystem::rename(partial, path);
      },
      nb::arg("path"), nb::arg("tree"));
  m.def(
      "_load_safetensors",
      [](const std::filesystem::path& path) {
        ckpt::SafetensorsFile file;
        {
          nb::gil_scoped_release release;
          file = ckpt::read_safetensors(path);
        }
        return file.tensors;
      },
      nb::arg("path"));
  nb::class_<ckpt::CheckpointManager>(m, "_CheckpointManager")
      .def("__init__",
           [](ckpt::CheckpointManager* self, const std::filesystem::path& run_dir, int keep_last, int keep_every) {
             new (self) ckpt::CheckpointManager(run_dir, ckpt::RetentionPolicy{keep_last, keep_every});
           })
      .def("save",
           [](ckpt::CheckpointManager& manager, int64_t step, nb::handle params, nb::handle opt_state) {
             ckpt::CheckpointState state{step, to_tree(params, "params"), to_tree(opt_state, "opt_state"), {}};
             nb::gil_scoped_release release;
             return manager.save(state);
           })
      .def("steps",
           [](const ckpt::CheckpointManager& manager) {
             std::vector<int64_t> steps;
             for (const auto& info : manager.list()) steps.push_back(info.step);
             return steps;
           })
      .def("restore_latest", [](const ckpt::CheckpointManager& manager, nb::handle params_like, nb::handle opt_like) {
        std::vector<std::string> warnings;
        std::optional<ckpt::CheckpointState> state =
            manager.restore_latest(to_tree(params_like, "params"), to_tree(opt_like, "opt_state"),
                                   [&](const std::string& w) { warnings.push_back(w); });
        if (!state) return nb::make_tuple(nb::none(), nb::none(), nb::none(), warnings);
        return nb::make_tuple(state->step, from_tree(state->params), from_tree(state->opt_state), warnings);
      });
  m.def("_verify_checkpoint", [](const std::filesystem::path& dir) {
    ckpt::VerifyResult r = ckpt::CheckpointManager::verify(dir);
    return std::make_pair(r.ok, r.problem);
  });

  nb::class_<data::Tokenizer>(m, "Tokenizer",
                              "A tokenizer named by a spec: 'byte', 'gpt2:DIR', 'hf:tokenizer.json', "
                              "'spm:tokenizer.model' (tessera.tokenizer(spec)).")
      .def_prop_ro("id", &data::Tokenizer::id)
      .def_prop_ro("spec", &data::Tokenizer::spec)
      .def_prop_ro("vocab_size", &data::Tokenizer::vocab_size)
      .def_prop_ro("eos_id", &data::Tokenizer::eos_id)
      .def(
          "encode", [](const data::Tokenizer& t, const std::string& text) { return t.encode(text); }, nb::arg("text"))
      .def(
          "decode", [](const data::Tokenizer& t, const std::vector<int32_t>& ids) { return t.decode(ids); },
          nb::arg("ids"));
  m.def(
      "tokenizer", [](const std::string& spec) { return std::shared_ptr<data::Tokenizer>(data::make_tokenizer(spec)); },
      nb::arg("spec"), "The tokenizer a spec names (the same specs as data.tokenizer in a config).");

  nb::class_<PyTrainer>(m, "_Trainer")
      .def("__init__",
           [](PyTrainer* self, const train::TrainConfig& c) {
             new (self) PyTrainer{c, nullptr};
           })
      .def(
          "fit",
          [](PyTrainer& self, std::optional<nb::callable> callback, bool progress, int64_t stop_at_step) {
            train::TrainerOptions options;
            options.progress = progress;
            options.stop_at_step = stop_at_step;
            std::shared_ptr<nb::callable> cb;
            if (callback) {
              cb = std::shared_ptr<nb::callable>(new nb::callable(std::move(*callback)), [](nb::callable* p) {
                nb::gil_scoped_acquire gil;
                delete p;
              });
              options.after_step = [cb](int64_t step) {
                nb::gil_scoped_acquire gil;
                (*cb)(step);
              };
            }
            train::TrainSummary summary;
            {
              nb::gil_scoped_release release;
              self.last = std::make_shared<train::Trainer>(self.config, options);
              summary = self.last->run();
            }
            return summary_dict(summary);
          },
          nb::arg("callback").none(), nb::arg("progress"), nb::arg("stop_at_step"))
      .def("params", [](const PyTrainer& self) { return self.last ? from_tree(self.last->params()) : nb::none(); })
      .def("opt_state",
           [](const PyTrainer& self) { return self.last ? from_tree(self.last->opt_state()) : nb::none(); });
}

}  // namespace tessera::python
