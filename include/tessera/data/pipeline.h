// A data pipeline at Grain's level: several sources mixed with weights, rows packed with
// document boundaries, a bounded shuffle buffer, worker threads prefetching batches,
// and a position that resumes the exact stream.
//
// The stream: a MixturePlan (data/sample_plan.h) lists rows g = 0, 1, 2, ... (a source
// row each); batch k of data-parallel rank r of w holds rows (k * batch + j) * w + r,
// j in [0, batch). A row becomes (data/source.h for rows):
//   packing "documents": tokens = window[0, seq), targets = window[1, seq]; segments
//     number the documents in the row from 1 (a new one at the row start and after every
//     document end), positions count from 0 in each segment, and a target that starts a
//     new document is -100 (no loss across a boundary);
//   packing "concat": tokens and targets only (documents run together).
//
// Workers: the caller's thread plans (cheap: indices only); `workers` threads read and
// build the planned batches, `prefetch` ahead. Which thread builds a batch never changes
// what it holds, so every worker count gives bitwise the same batches.
//
// Position: {"rows": rows consumed by all ranks, "fingerprint": the spec's}. A restore
// replays the plan to that row (indices only; no token is read).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/data/batch_stream.h"
#include "tessera/data/pipeline_spec.h"
#include "tessera/data/sample_plan.h"
#include "tessera/data/source.h"

namespace tessera::data {

struct SourceStats {
  std::string name, kind;
  double weight = 0;              // asked: weight / sum of weights
  uint64_t rows = 0, tokens = 0;  // consumed so far (all ranks); tokens = rows * seq
  uint64_t epoch = 0;             // the epoch of this source the plan is in
  uint64_t source_rows = 0, source_tokens = 0, shards = 0;
};

class Pipeline : public BatchStream {
 public:
  // Opens every source (errors name the source; data/source.h). vocab 0: the tokenizer's.
  Pipeline(PipelineSpec spec, const Tokenizer& tokenizer, int64_t batch, int64_t seq, uint64_t seed, int rank = 0,
           int world = 1, int64_t vocab = 0);
  ~Pipeline() override;
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  Batch next_rows(int64_t begin, int64_t end) override;
  int64_t batch_size() const override { return batch_; }
  int64_t seq() const override { return seq_; }
  nlohmann::json position_json() const override;
  void restore_position(const nlohmann::json& position, const std::string& where) override;

  uint64_t rows_consumed() const { return batches_taken_ * static_cast<uint64_t>(batch_ * world_); }
  std::vector<SourceStats> stats() const;  // over the rows consumed so far
  // What the first `rows` rows of the stream (all ranks) take from each source: planned
  // only (no token is read), as `tessera data stats` reports a run before it runs.
  std::vector<SourceStats> planned_stats(uint64_t rows) const;
  const PipelineSpec& spec() const { return spec_; }
  const std::vector<std::unique_ptr<Source>>& sources() const { return sources_; }

 private:
  struct Job {
    uint64_t index = 0;
    std::vector<RowRef> rows;          // this rank's rows of the batch
    std::vector<uint64_t> per_source;  // rows of the whole batch (all ranks) from each source
    int64_t begin = 0, end = 0;        // the rows built
    Batch batch;
    std::exception_ptr error;
    bool done = false;
  };
  PipelineSpec spec_;
  int64_t batch_, seq_;
  uint64_t seed_;
  int rank_, world_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::unique_ptr<MixturePlan> plan_;
  uint64_t batches_taken_ = 0, batches_planned_ = 0;
  std::vector<uint64_t> consumed_;  // rows consumed from each source (all ranks)

  std::mutex mutex_;
  std::condition_variable work_ready_, job_done_;
  std::deque<std::shared_ptr<Job>> queued_;   // planned, not yet taken by a worker
  std::deque<std::shared_ptr<Job>> pending_;  // planned, not yet consumed (in order)
  std::vector<std::thread> workers_;
  bool stopping_ = false;
  int64_t range_begin_ = 0, range_end_ = 0;  // the rows prefetched jobs build

  std::shared_ptr<Job> plan_batch();
  void build(Job& job) const;
  Batch build_rows(const std::vector<RowRef>& rows, int64_t begin, int64_t end) const;
  void worker_loop();
  void drain();  // drops prefetched jobs (waits for those being built)
  void reset_plan(uint64_t rows);
  std::unique_ptr<MixturePlan> make_plan() const;
  std::vector<SourceStats> stats_of(const std::vector<uint64_t>& rows, const MixturePlan& plan) const;
};

}  // namespace tessera::data
