// Builds synthetic goodput event logs (JSONL text) for the tests, with explicit times.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::goodput::testing {

class LogBuilder {
 public:
  LogBuilder& event(double t, const std::string& type, nlohmann::json fields = nlohmann::json::object()) {
    nlohmann::json e = {{"v", 1}, {"t", t}, {"type", type}};
    if (attempt_ >= 0) e["attempt"] = attempt_;
    for (auto& [k, v] : fields.items()) e[k] = v;
    lines_.push_back(e.dump());
    return *this;
  }
  LogBuilder& attempt(double t, int number, const std::string& reason = "") {
    attempt_ = number;
    return event(t, "attempt_start", {{"reason", reason}});
  }
  LogBuilder& phase(double t0, double t1, const std::string& name, nlohmann::json fields = nlohmann::json::object()) {
    event(t0, name + "_start", fields);
    return event(t1, name + "_end", fields);
  }
  LogBuilder& step(int64_t step, double t0, double t1, int64_t tokens = 100, double flops = 1e9) {
    event(t0, "step_start", {{"step", step}});
    return event(t1, "step_end", {{"step", step}, {"tokens", tokens}, {"model_flops", flops}});
  }
  LogBuilder& save(int64_t step, double t0, double t1, const std::string& part, bool committed) {
    event(t0, "checkpoint_save_start", {{"step", step}, {"part", part}});
    return event(t1, "checkpoint_save_end", {{"step", step}, {"part", part}, {"committed", committed}});
  }
  std::vector<std::string>& lines() { return lines_; }
  std::string text() const {
    std::string out;
    for (const std::string& l : lines_) out += l + "\n";
    return out;
  }

 private:
  std::vector<std::string> lines_;
  int attempt_ = -1;
};

}  // namespace tessera::goodput::testing
