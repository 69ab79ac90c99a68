#include "tessera/data/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tessera/base/error.h"
#include "tessera/base/json_field.h"

namespace tessera::data {

Pipeline::Pipeline(PipelineSpec spec, const Tokenizer& tokenizer, int64_t batch, int64_t seq, uint64_t seed, int rank,
                   int world, int64_t vocab)
    : spec_(std::move(spec)), batch_(batch), seq_(seq), seed_(seed), rank_(rank), world_(world) {
  spec_.validate();
  if (batch_ <= 0 || seq_ <= 0) fail<ValueError>("data pipeline: batch {} and seq {} must be positive", batch_, seq_);
  if (world_ <= 0 || rank_ < 0 || rank_ >= world_)
    fail<ValueError>("data pipeline: rank {} out of range for world size {}", rank_, world_);
  for (const SourceSpec& source : spec_.sources)
    sources_.push_back(std::make_unique<Source>(source, tokenizer, seq_, vocab));
  for (size_t i = 0; i < sources_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (sources_[i]->name() == sources_[j]->name())
        fail<ConfigError>("data.mixture: two sources are named '{}' ({} and {}); give them distinct names",
                          sources_[i]->name(), spec_.sources[j].path, spec_.sources[i].path);
  reset_plan(0);
  for (int i = 0; i < spec_.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

Pipeline::~Pipeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

std::unique_ptr<MixturePlan> Pipeline::make_plan() const {
  std::vector<std::vector<uint64_t>> shard_rows;
  std::vector<double> weights;
  for (size_t s = 0; s < sources_.size(); ++s) {
    std::vector<uint64_t> rows_of(sources_[s]->shards());
    for (size_t k = 0; k < rows_of.size(); ++k) rows_of[k] = sources_[s]->shard_rows(k);
    shard_rows.push_back(std::move(rows_of));
    weights.push_back(spec_.sources[s].weight);
  }
  return std::make_unique<MixturePlan>(shard_rows, weights, seed_, spec_.shuffle_buffer);
}

void Pipeline::reset_plan(uint64_t rows) {
  plan_ = make_plan();
  plan_->skip(rows);
  consumed_ = plan_->taken();
}

std::shared_ptr<Pipeline::Job> Pipeline::plan_batch() {
  auto job = std::make_shared<Job>();
  job->index = batches_planned_++;
  job->rows.reserve(static_cast<size_t>(batch_));
  job->per_source.assign(sources_.size(), 0);
  for (int64_t g = 0; g < batch_ * world_; ++g) {
    const RowRef row = plan_->next();
    ++job->per_source[row.source];
    if (g % world_ == rank_) job->rows.push_back(row);
  }
  job->begin = range_begin_;
  job->end = range_end_;
  return job;
}

Batch Pipeline::build_rows(const std::vector<RowRef>& rows, int64_t begin, int64_t end) const {
  const auto s = static_cast<size_t>(seq_), n = static_cast<size_t>(end - begin);
  const bool documents = spec_.packing == "documents";
  std::vector<int32_t> tokens(n * s), targets(n * s), segments, positions;
  if (documents) segments.resize(n * s), positions.resize(n * s);
  std::vector<int32_t> window(s + 1);
  std::vector<uint8_t> starts(s + 1);
  for (size_t i = 0; i < n; ++i) {
    const RowRef& ref = rows[static_cast<size_t>(begin) + i];
    sources_[ref.source]->read_row(ref.shard, ref.row, window.data(), starts.data());
    std::copy(window.begin(), window.end() - 1, tokens.begin() + static_cast<ptrdiff_t>(i * s));
    std::copy(window.begin() + 1, window.end(), targets.begin() + static_cast<ptrdiff_t>(i * s));
    if (!documents) continue;
    int32_t segment = 0, segment_start = 0;
    for (size_t t = 0; t < s; ++t) {
      if (starts[t]) ++segment, segment_start = static_cast<int32_t>(t);
      segments[i * s + t] = segment;
      positions[i * s + t] = static_cast<int32_t>(t) - segment_start;
      if (starts[t + 1]) targets[i * s + t] = -100;  // the next token opens another document
    }
  }
  const Shape shape{end - begin, seq_};
  Batch batch{Array::from_vector(tokens, shape), Array::from_vector(targets, shape), std::nullopt, std::nullopt};
  if (documents) {
    batch.segments = Array::from_vector(segments, shape);
    batch.positions = Array::from_vector(positions, shape);
  }
  return batch;
}

void Pipeline::build(Job& job) const {
  try {
    job.batch = build_rows(job.rows, job.begin, job.end);
  } catch (...) {
    job.error = std::current_exception();
  }
}

void Pipeline::worker_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
      if (stopping_) return;
      job = queued_.front();
      queued_.pop_front();
    }
    build(*job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job->done = true;
    }
    job_done_.notify_all();
  }
}

Batch Pipeline::next_rows(int64_t begin, int64_t end) {
  if (begin < 0 || end > batch_ || begin >= end)
    fail<ValueError>("data pipeline: rows [{}, {}) of a batch of {}", begin, end, batch_);
  std::shared_ptr<Job> job;
  if (workers_.empty()) {
    range_begin_ = begin, range_end_ = end;
    job = plan_batch();
    build(*job);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    if (pending_.empty()) range_begin_ = begin, range_end_ = end;
    while (static_cast<int64_t>(pending_.size()) < spec_.prefetch + 1) {
      pending_.push_back(plan_batch());
      queued_.push_back(pending_.back());
    }
    work_ready_.notify_all();
    job = pending_.front();
    job_done_.wait(lock, [&] { return job->done; });
    pending_.pop_front();
    range_begin_ = begin, range_end_ = end;  // what the next planned jobs build
  }
  if (job->error) std::rethrow_exception(job->error);
  if (job->begin != begin || job->end != end) {
    // Prefetched for other rows: build the asked ones here (the plan is the same).
    job->begin = begin, job->end = end;
    build(*job);
    if (job->error) std::rethrow_exception(job->error);
  }
  ++batches_taken_;
  for (size_t s = 0; s < consumed_.size(); ++s) consumed_[s] += job->per_source[s];
  return std::move(job->batch);
}

void Pipeline::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::vector<std::shared_ptr<Job>> unstarted(queued_.begin(), queued_.end());
  queued_.clear();
  job_done_.wait(lock, [&] {
    for (const auto& job : pending_)
      if (!job->done && std::find(unstarted.begin(), unstarted.end(), job) == unstarted.end()) return false;
    return true;
  });
  pending_.clear();
}

nlohmann::json Pipeline::position_json() const {
  return {{"pipeline", {{"rows", rows_consumed()}, {"fingerprint", fmt::format("{:016x}", spec_.fingerprint())}}}};
}

void Pipeline::restore_position(const nlohmann::json& position, const std::string& where) {
  const nlohmann::json pipeline = json_field_or<nlohmann::json>(position, "pipeline", nlohmann::json());
  const std::optional<uint64_t> rows = json_field<uint64_t>(pipeline, "rows");
  const std::optional<std::string> fingerprint = json_field<std::string>(pipeline, "fingerprint");
  if (!rows || !fingerprint)
    fail<IOError>(
        "resume: checkpoint {} has no data pipeline position (manifest extra.data.pipeline.rows/fingerprint); it was "
        "written by a run reading one token file (data.train), not data.mixture",
        where);
  const std::string expected = fmt::format("{:016x}", spec_.fingerprint());
  if (*fingerprint != expected)
    fail<IOError>(
        "resume: checkpoint {} was taken on another data stream (fingerprint {}, this config's {}): data.mixture, "
        "data.packing or data.shuffle_buffer changed; use a new run.dir",
        where, *fingerprint, expected);
  const uint64_t per_batch = static_cast<uint64_t>(batch_ * world_);
  if (*rows % per_batch != 0)
    fail<IOError>("resume: checkpoint {} consumed {} rows, not a whole number of batches of {} rows", where, *rows,
                  per_batch);
  drain();
  batches_taken_ = batches_planned_ = *rows / per_batch;
  reset_plan(*rows);
}

std::vector<SourceStats> Pipeline::stats_of(const std::vector<uint64_t>& rows, const MixturePlan& plan) const {
  const double total = std::accumulate(spec_.sources.begin(), spec_.sources.end(), 0.0,
                                       [](double sum, const SourceSpec& s) { return sum + s.weight; });
  std::vector<SourceStats> out;
  for (size_t s = 0; s < sources_.size(); ++s) {
    SourceStats st;
    st.name = sources_[s]->name();
    st.kind = sources_[s]->kind();
    st.weight = spec_.sources[s].weight / total;
    st.rows = rows[s];
    st.tokens = rows[s] * static_cast<uint64_t>(seq_);
    st.epoch = plan.epoch(s);
    st.source_rows = sources_[s]->rows();
    st.source_tokens = sources_[s]->tokens();
    st.shards = sources_[s]->shards();
    out.push_back(st);
  }
  return out;
}

std::vector<SourceStats> Pipeline::stats() const { return stats_of(consumed_, *plan_); }

std::vector<SourceStats> Pipeline::planned_stats(uint64_t rows) const {
  const std::unique_ptr<MixturePlan> plan = make_plan();
  plan->skip(rows);
  return stats_of(plan->taken(), *plan);
}

}  // namespace tessera::data
