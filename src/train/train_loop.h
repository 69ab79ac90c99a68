// One attempt of a training run, as named stages (Trainer::run_attempt runs one):
//   setup     threads, the peak for MFU, data and tokenizer checks, model, optimizer,
//             the SPMD layout, loaders, checkpoint tiers
//   restore   the newest valid checkpoint (or run.init_from), then the layout's shards
//   compile   the step's programs before the first step, as their own goodput phase
//   step      one optimizer step: batches, the compiled step, loss checks, metrics,
//             evaluation and checkpoints when due
//   finish    the summary, the final evaluation and checkpoint (or, after a stop
//             signal, the checkpoint only)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data/loader.h"
#include "tessera/data/tokenizer.h"
#include "tessera/goodput/rank_log.h"
#include "tessera/goodput/recorder.h"
#include "tessera/models/model.h"
#include "tessera/optim/optimizer.h"
#include "tessera/train/parallel.h"
#include "tessera/train/pipeline_step.h"
#include "tessera/train/progress.h"
#include "tessera/train/tensorboard.h"
#include "tessera/train/train_step.h"
#include "tessera/train/trainer.h"
#include "train/checkpoint_saver.h"
#include "train/heartbeat.h"
#include "train/pipeline_config.h"
#include "train/stack_request.h"

namespace tessera::train {

// This process's rank in the job: its MPI rank under mpirun (or srun with PMI), else
// what the launcher said (TESSERA_RANK for `tessera launch` workers, which share no
// communicator; goodput::rank_from_environment).
goodput::RankIdentity job_rank();

class TrainLoop {
 public:
  // params / opt_state / tensorboard: the Trainer's, which outlive the attempt.
  // stop_signal: set by SIGINT/SIGTERM (the loop saves and returns). recorder: the job's
  // goodput log (rank 0 only); rank_recorder: this rank's step records (every rank).
  TrainLoop(const TrainConfig& config, const TrainerOptions& options, goodput::Recorder* recorder,
            goodput::RankRecorder* rank_recorder, Tree& params, Tree& opt_state,
            std::unique_ptr<TensorBoardWriter>& tensorboard, const std::atomic<int>& stop_signal);
  TrainSummary run();

 private:
  using Clock = std::chrono::steady_clock;

  void setup();
  void measure_peak();
  // On the CPU, an int8 run's peak: its matmul FLOPs' mix of int8 and compute-dtype GEMMs.
  void mix_int8_peak(const std::map<std::string, double>& flops);
  void open_data();
  void build_layout();
  void restore();
  void open_metrics();
  void compile();
  // The reason to stop before the next step ("" to go on).
  std::string stop_reason();
  void step_once();
  // The end of a run: finish_run(), then the whole parameters and optimizer state.
  TrainSummary finish();
  // The summary, the final evaluation and save (or the save alone after a signal).
  TrainSummary finish_run();
  std::string parallel_summary() const;

  void note(const std::string& text) const;
  // A goodput span for `phase`; the heartbeat enters the phase too (launch's hang limits
  // follow it).
  std::unique_ptr<goodput::Span> span(goodput::Phase phase);
  void write_metrics(const nlohmann::json& record);
  double validate();
  std::vector<data::Batch> next_batches();
  std::optional<Array> dropout_key_for(int64_t at_step) const;
  // final: the persistent tier too, whatever the interval.
  void save(int64_t at_step, bool final);

  const TrainConfig& cfg_;
  const TrainerOptions& options_;
  goodput::Recorder* recorder_;
  goodput::RankRecorder* rank_recorder_;
  Tree& params_;
  Tree& opt_state_;
  std::unique_ptr<TensorBoardWriter>& tensorboard_;
  const std::atomic<int>& stop_signal_;
  const bool primary_;
  const bool show_;
  const std::filesystem::path run_dir_;
  TrainSummary summary_;

  double peak_ = 0;
  std::string peak_source_;
  double local_peak_ = 0;  // this process's CPU calibration (peak_ may sum the ranks')
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::shared_ptr<const data::TokenFile> train_file_, val_file_;
  std::optional<models::Model> model_;
  std::optional<optim::Optimizer> optimizer_;
  std::optional<Layout> layout_;               // always set by setup(): a 1-device mesh without parallel.mesh
  std::unique_ptr<data::BatchStream> loader_;  // a DataLoader over data.train, or the data pipeline
  std::optional<data::DataLoader> val_loader_;
  std::optional<CheckpointSaver> checkpoints_;
  std::optional<Evaluator> evaluator_;
  std::optional<TrainStep> train_step_;        // unless the mesh has a pipeline axis
  std::optional<PipelinePlan> pipeline_plan_;  // a pipeline axis: its resolved options
  std::optional<PipelineTrainStep> pipeline_step_;
  std::vector<double> pipeline_bubbles_;  // per step: the measured idle share

  int64_t step_ = 0;
  double tokens_seen_ = 0;
  double flops_per_token_ = 0;
  double tokens_per_step_ = 0;
  std::ofstream metrics_;
  std::optional<Progress> progress_;
  std::optional<Heartbeat> heartbeat_;
  std::optional<StackRequestWatcher> stack_requests_;
  std::vector<double> step_times_;
  Clock::time_point loop_start_;
  int64_t skipped_in_a_row_ = 0;  // loss scaling: steps skipped for non-finite gradients
};

}  // namespace tessera::train
