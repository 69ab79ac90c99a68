#include "tessera/train/parallel.h"

#include <fmt/format.h>

#include "tessera/base/error.h"
#include "tessera/nn/logical_sharding.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"

namespace tessera::train {

AxisRules default_axis_rules() {
  return {{"batch", {"data", "fsdp", "expert"}},
          {"embed", {"fsdp"}},
          {"norm", {"fsdp"}},
          {"heads", {"tensor"}},
          {"kv_heads", {"tensor"}},
          {"mlp", {"tensor"}},
          {"vocab", {"tensor"}},
          {"experts", {"expert"}},
          {"moe_groups", {"data", "fsdp"}},
          {"position", {}},
          {"head_dim", {}}};
}

AxisRules parse_axis_rules(const std::string& text, const AxisRules& base) {
  AxisRules rules = base;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string entry = text.substr(start, comma - start);
    start = comma + 1;
    if (entry.empty()) continue;
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0)
      fail<ConfigError>("parallel.rules: entry '{}' is not logical=mesh_axis[+mesh_axis...] (e.g. embed=fsdp)", entry);
    std::string logical = entry.substr(0, eq);
    std::vector<std::string> axes;
    std::string rest = entry.substr(eq + 1);
    size_t p = 0;
    while (p < rest.size()) {
      size_t plus = rest.find('+', p);
      if (plus == std::string::npos) plus = rest.size();
      if (plus > p) axes.push_back(rest.substr(p, plus - p));
      p = plus + 1;
    }
    rules[logical] = axes;
  }
  return rules;
}

Layout::Layout(spmd::Mesh mesh, AxisRules rules, nn::ParamSpecs specs)
    : mesh_(std::move(mesh)), rules_(std::move(rules)), specs_(std::move(specs)) {
  for (const auto& [path, info] : specs_) {
    const spmd::PartitionSpec spec = nn::logical_spec(mesh_, rules_, info.axes);
    spmd::Sharding s = spmd::Sharding::from_spec(mesh_, spec, static_cast<int>(info.shape.size()), path);
    try {
      s.check_divisible(info.shape, "parameter " + path);
    } catch (const ShapeError& e) {
      fail<ConfigError>("parallel: {} (logical axes [{}]); change the mesh or parallel.rules", e.what(),
                        fmt::join(info.axes, ", "));
    }
    params_.emplace(path, s);
  }
}

Layout Layout::one_device(nn::ParamSpecs specs) {
  return Layout(spmd::Mesh({"data"}, {1}), default_axis_rules(), std::move(specs));
}

const spmd::Sharding& Layout::param(const std::string& path) const {
  auto it = params_.find(path);
  if (it == params_.end()) fail<ValueError>("parallel: no parameter '{}' in the model", path);
  return it->second;
}

spmd::Sharding Layout::batch(int rank) const {
  spmd::Axes axes;
  auto it = rules_.find("batch");
  if (it != rules_.end())
    for (const std::string& a : it->second)
      if (mesh_.has_axis(a) && mesh_.axis_size(a) > 1) axes.push_back(a);
  spmd::PartitionSpec spec;
  spec.dims.push_back(axes);
  return spmd::Sharding::from_spec(mesh_, spec, rank, "batch");
}

int64_t Layout::data_parallel_size() const { return batch(1).num_shards(0); }

std::optional<spmd::Sharding> Layout::leaf_sharding(const std::string& path, const Array& leaf) const {
  auto after = [&](const std::string& prefix) -> std::optional<std::string> {
    if (path.starts_with(prefix)) return path.substr(prefix.size());
    return std::nullopt;
  };
  for (const char* prefix : {"params.", "grads."})
    if (auto p = after(prefix)) return param(*p);
  if (path == "opt.step") return spmd::Sharding::replicated(mesh_, leaf.ndim());
  if (auto rest = after("opt.")) {
    // Optimizer state: a leaf shaped like its parameter ("opt.m.<path>") follows the
    // parameter's layout; any other (Adafactor's factored rows and columns, 0-d slots,
    // the step count) is replicated.
    size_t dot = rest->find('.');
    if (dot != std::string::npos) {
      const std::string path = rest->substr(dot + 1);
      auto spec = specs_.find(path);
      if (params_.count(path) && spec != specs_.end() && spec->second.shape == leaf.shape()) return param(path);
    }
    return spmd::Sharding::replicated(mesh_, leaf.ndim());
  }
  if (path == "tokens" || path == "targets") return batch(leaf.ndim());
  return std::nullopt;
}

std::vector<std::optional<spmd::Sharding>> Layout::shardings_for(const Tree& tree) const {
  std::vector<std::optional<spmd::Sharding>> out;
  if (splits_nothing()) return out;  // no layouts: the plain program
  std::vector<Array> leaves = tree.leaves();
  std::vector<std::string> paths = tree.paths();
  for (size_t i = 0; i < leaves.size(); ++i) out.push_back(leaf_sharding(paths[i], leaves[i]));
  return out;
}

Tree Layout::shard_params(const Tree& params) const {
  if (splits_nothing()) return params;
  std::vector<Array> leaves = params.leaves();
  std::vector<std::string> paths = params.paths();
  for (size_t i = 0; i < leaves.size(); ++i) leaves[i] = spmd::device_put(leaves[i], param(paths[i]), paths[i]);
  return params.with_leaves(leaves);
}

Tree Layout::shard_opt_state(const Tree& opt_state) const {
  if (splits_nothing()) return opt_state;
  std::vector<Array> leaves = opt_state.leaves();
  std::vector<std::string> paths = opt_state.paths();
  for (size_t i = 0; i < leaves.size(); ++i) {
    std::optional<spmd::Sharding> s = leaf_sharding("opt." + paths[i], leaves[i]);
    leaves[i] = spmd::device_put(leaves[i], s ? *s : spmd::Sharding::replicated(mesh_, leaves[i].ndim()), paths[i]);
  }
  return opt_state.with_leaves(leaves);
}

data::Batch Layout::shard_batch(const data::Batch& batch) const {
  if (splits_nothing()) return batch;
  data::Batch out = batch;
  out.tokens = spmd::device_put(batch.tokens, this->batch(batch.tokens.ndim()), "batch tokens");
  out.targets = spmd::device_put(batch.targets, this->batch(batch.targets.ndim()), "batch targets");
  // Packed documents: segment ids and positions are split along the batch like tokens.
  if (batch.segments) out.segments = spmd::device_put(*batch.segments, this->batch(2), "batch segments");
  if (batch.positions) out.positions = spmd::device_put(*batch.positions, this->batch(2), "batch positions");
  return out;
}

data::Batch Layout::next_batch(data::BatchStream& loader, int64_t batch_size) const {
  const std::vector<int> devices = spmd::local_devices();
  if (splits_nothing() || !spmd::is_multi_process() || devices.size() != 1) return shard_batch(loader.next_batch());
  const spmd::Sharding s = batch(2);
  const int device = devices[0];
  const int64_t shards = s.num_shards(0), rows = batch_size / shards, index = s.shard_index(0, device);
  data::Batch local = loader.next_rows(index * rows, (index + 1) * rows);
  auto place = [&](const Array& a) {
    std::vector<Array> per_device(static_cast<size_t>(mesh_.size()));
    per_device[static_cast<size_t>(device)] = a;
    return spmd::make_sharded({batch_size, a.shape(1)}, a.dtype(), s, std::move(per_device));
  };
  data::Batch out{place(local.tokens), place(local.targets)};
  if (local.segments) out.segments = place(*local.segments);
  if (local.positions) out.positions = place(*local.positions);
  return out;
}

Tree Layout::gather(const Tree& tree) {
  return tree.map([](const Array& a) { return spmd::gather(a); });
}

std::string Layout::describe() const {
  std::string s = fmt::format("mesh {}; batch {}\n", mesh_.to_string(), batch(1).to_string());
  for (const auto& [path, sharding] : params_)
    s += fmt::format("  {:<32} {:<14} {}\n", path, to_string(specs_.at(path).shape), sharding.to_string());
  return s;
}

double Layout::analytic_step_bytes(int64_t layers, int64_t dim, int64_t batch, int64_t seq) const {
  return analytic_bytes(PartBytes{nullptr, layers, true, true, "", nullptr}, dim, batch, seq, false);
}

double Layout::analytic_recomputed_part_bytes(const PartBytes& part, int64_t dim, int64_t batch, int64_t seq) const {
  return analytic_bytes(part, dim, batch, seq, true);
}

double Layout::analytic_kept_part_bytes(const PartBytes& part, int64_t dim, int64_t batch, int64_t seq) const {
  if (!part.read_by_backward) fail<ValueError>("analytic_kept_part_bytes: the part has no read_by_backward predicate");
  return analytic_bytes(part, dim, batch, seq, false);
}

double Layout::analytic_bytes(const PartBytes& part, int64_t dim, int64_t batch, int64_t seq, bool recompute) const {
  std::vector<int> batch_axes = this->batch(1).dim_axes(0);
  auto is_batch_axis = [&](int a) { return std::find(batch_axes.begin(), batch_axes.end(), a) != batch_axes.end(); };
  auto ring = [](double n) { return (n - 1) / n; };
  // A recomputed forward all-gathers the parameters and all-reduces the activations again:
  // the forward's collectives count once per forward run, the backward's once.
  const double forward_runs = recompute ? 2 : 1;
  double bytes = 0;
  for (const auto& [path, s] : params_) {
    if (part.includes && !part.includes(path)) continue;
    const nn::ParamInfo& info = specs_.at(path);
    double local = static_cast<double>(numel(info.shape)) * static_cast<double>(itemsize(info.dtype));
    double fsdp = 1, other = 1;
    std::vector<int> split;
    for (int d = 0; d < s.rank(); ++d) split.insert(split.end(), s.dim_axes(d).begin(), s.dim_axes(d).end());
    for (int a : split)
      if (!is_batch_axis(a)) local /= mesh_.axis_size(a);
    for (int a : batch_axes) {
      bool sharded = std::find(split.begin(), split.end(), a) != split.end();
      (sharded ? fsdp : other) *= mesh_.axis_size(a);
    }
    const double gathers = part.read_by_backward                   ? (part.read_by_backward(path) ? 2 : 1)
                           : recompute && path == part.output_bias ? 1
                                                                   : forward_runs;
    // The position table is read in its first `seq` rows only, which is what its
    // all-gathers move; its gradient covers every row.
    const double read =
        path == "wpe" ? std::min(1.0, static_cast<double>(seq) / static_cast<double>(info.shape.at(0))) : 1.0;
    if (fsdp > 1) bytes += (gathers * read + 1) * ring(fsdp) * local;  // all-gather(s) + reduce-scatter
    if (other > 1) bytes += 2 * ring(other) * local / fsdp;            // all-reduce of the (scattered) gradient
  }
  double tensor = 1;
  auto it = rules_.find("heads");
  if (it != rules_.end())
    for (const std::string& a : it->second)
      if (mesh_.has_axis(a)) tensor *= mesh_.axis_size(a);
  const double rows = static_cast<double>(batch / data_parallel_size() * seq);
  const double activation = rows * static_cast<double>(dim) * 4.0;
  if (tensor > 1) {
    bytes += (2 * forward_runs + 2) * static_cast<double>(part.layers) * 2 * ring(tensor) * activation;
    if (recompute && !part.head && part.layers > 0) bytes -= 2 * ring(tensor) * activation;  // the output's
  }
  double vocab = 1;
  if (auto v = rules_.find("vocab"); v != rules_.end())
    for (const std::string& a : v->second)
      if (mesh_.has_axis(a)) vocab *= mesh_.axis_size(a);
  if (vocab > 1) {
    // The lookup's partial sum and the head's input gradient ([rows, dim] all-reduces),
    // and the vocabulary-parallel loss: an all-gather of the row maxima and all-reduces
    // of the sums of exponentials and of the target logits ([rows] floats each).
    if (part.embedding) bytes += forward_runs * 2 * ring(vocab) * activation;
    if (part.head) {
      bytes += 2 * ring(vocab) * activation;
      bytes += forward_runs * ((vocab - 1) * rows * 4.0 + 2 * ring(vocab) * rows * 4.0) + 2 * ring(vocab) * rows * 4.0;
    }
  }
  return bytes;
}

}  // namespace tessera::train
