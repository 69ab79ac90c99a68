// Stage-local parameters and optimizer state of a pipeline over processes (see
// pipeline_step.h): which process holds which parameter (with partitioned stages: its
// device's shard of it), the placeholders of the others, and
// gathering the whole trees back (checkpoints, the end of a run).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "tessera/base/error.h"
#include "tessera/core/abstract_creation.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/train/pipeline_step.h"

namespace tessera::train {
namespace {

// A tree of dicts holding `leaves` at their dotted paths.
Tree tree_at_paths(const std::vector<std::pair<std::string, Array>>& leaves) {
  Tree out = Tree::dict();
  for (const auto& [path, leaf] : leaves) {
    Tree* node = &out;
    std::string rest = path;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
      node = &(*node)[rest.substr(0, dot)];
    (*node)[rest] = leaf;
  }
  return out;
}

}  // namespace

Tree PipelineTrainStep::select(const Tree& whole, const std::vector<bool>& keep) {
  const std::vector<std::string> paths = whole.paths();
  const std::vector<Array> leaves = whole.leaves();
  if (keep.size() != leaves.size())
    fail<Error>("pipeline step: a tree of {} leaves where the parameters have {}", leaves.size(), keep.size());
  std::vector<std::pair<std::string, Array>> kept;
  for (size_t i = 0; i < leaves.size(); ++i)
    if (keep[i]) kept.emplace_back(paths[i], leaves[i]);
  return tree_at_paths(kept);
}

Tree PipelineTrainStep::merge(const Tree& whole, const Tree& selected) {
  std::map<std::string, Array> by_path;
  const std::vector<std::string> selected_paths = selected.paths();
  const std::vector<Array> selected_leaves = selected.leaves();
  for (size_t i = 0; i < selected_leaves.size(); ++i) by_path.emplace(selected_paths[i], selected_leaves[i]);
  const std::vector<std::string> paths = whole.paths();
  std::vector<Array> leaves = whole.leaves();
  size_t used = 0;
  for (size_t i = 0; i < leaves.size(); ++i)
    if (auto it = by_path.find(paths[i]); it != by_path.end()) {
      leaves[i] = it->second;
      ++used;
    }
  if (used != by_path.size()) fail<Error>("pipeline step: selected leaves that the whole tree does not have");
  return whole.with_leaves(leaves);
}

Tree PipelineTrainStep::select_state(const Tree& state, const std::vector<bool>& keep) const {
  Tree out = Tree::dict();
  for (const auto& [slot, subtree] : state.items())
    out[slot] = !subtree.is_leaf() && subtree.paths() == placement_->paths ? select(subtree, keep) : subtree;
  return out;
}

Tree PipelineTrainStep::merge_state(const Tree& state, const Tree& selected) const {
  Tree out = Tree::dict();
  for (const auto& [slot, subtree] : state.items())
    out[slot] = !subtree.is_leaf() && subtree.paths() == placement_->paths ? merge(subtree, selected.at(slot))
                                                                           : selected.at(slot);
  return out;
}

const PipelineTrainStep::Placement& PipelineTrainStep::placement_for(const Tree& params) {
  if (placement_) {
    if (params.paths() != placement_->paths)
      fail<ValueError>("pipeline step: the parameters' structure changed since the first step");
    return *placement_;
  }
  Placement p;
  p.paths = params.paths();
  for (size_t i = 0; i < p.paths.size(); ++i) p.index.emplace(p.paths[i], i);
  const std::vector<Array> leaves = params.leaves();
  const PipelineSchedule& s = schedule();
  const int pipeline_axis = world_mesh_.axis_index("pipeline");
  const bool tied = model_.config().resolved_tied();
  const int me = spmd::local_devices().front();
  auto coordinate = [&](int device) { return world_mesh_.coords(device)[static_cast<size_t>(pipeline_axis)]; };
  for (int device = 0; device < world_mesh_.size(); ++device)
    if (coordinate(device) == coordinate(me)) p.coordinate_group.push_back(device);
  std::vector<std::vector<bool>> reads;  // per pipeline coordinate, per leaf
  for (int d = 0; d < s.devices; ++d) reads.push_back(device_reads(params, stage_layers(), s.devices, d, tied));
  // The same device of another stage: equal coordinates on every axis but pipeline.
  std::vector<int> mine = world_mesh_.coords(me);
  auto same_piece_device = [&](int device) {
    std::vector<int> c = world_mesh_.coords(device);
    c[static_cast<size_t>(pipeline_axis)] = mine[static_cast<size_t>(pipeline_axis)];
    return c == mine;
  };
  for (size_t i = 0; i < leaves.size(); ++i) {
    // The world devices at the pipeline coordinates whose stages read the leaf.
    std::vector<int> owners;
    for (int device = 0; device < world_mesh_.size(); ++device)
      if (reads[static_cast<size_t>(coordinate(device))][i]) owners.push_back(device);
    if (owners.empty()) fail<Error>("pipeline step: no stage reads the parameter '{}'", p.paths[i]);
    const bool held = std::find(owners.begin(), owners.end(), me) != owners.end();
    double bytes = static_cast<double>(numel(leaves[i].shape()) * static_cast<int64_t>(itemsize(leaves[i].dtype())));
    p.whole_bytes += bytes;
    std::optional<spmd::Sharding> sharding;
    bool counted = owners.front() == me;
    if (shard_state_) {
      // Held as this device's shard, unless the layout splits it over no axis.
      sharding = executors_.front().param_sharding(p.paths[i]);
      const Shape local = sharding->local_shape(leaves[i].shape());
      if (local == leaves[i].shape()) sharding.reset();
      bytes = static_cast<double>(numel(local) * static_cast<int64_t>(itemsize(leaves[i].dtype())));
      std::vector<int> peers;
      for (int device : owners)
        if (same_piece_device(device)) peers.push_back(device);
      // The norm counts a piece once: on its first stage's device whose coordinates are 0
      // on the axes that do not split it (its copies elsewhere are equal).
      std::vector<bool> splits(static_cast<size_t>(world_mesh_.ndim()), false);
      if (sharding)
        for (int d = 0; d < sharding->rank(); ++d)
          for (int a : sharding->dim_axes(d)) splits[static_cast<size_t>(a)] = true;
      counted = held && peers.front() == me;
      for (int a = 0; a < world_mesh_.ndim(); ++a)
        if (a != pipeline_axis && !splits[static_cast<size_t>(a)] && mine[static_cast<size_t>(a)] != 0) counted = false;
      p.peers.push_back(std::move(peers));
    }
    p.held_bytes += held ? bytes : 0;
    p.held.push_back(held);
    p.counted.push_back(counted);
    p.sharding.push_back(std::move(sharding));
    p.owners.push_back(std::move(owners));
  }
  placement_ = std::move(p);
  return *placement_;
}

bool PipelineTrainStep::holds(const std::string& path) {
  if (!multi_process_) return true;
  if (!placement_) (void)placement_for(model_.placeholders());
  const auto it = placement_->index.find(path);
  if (it == placement_->index.end()) fail<ValueError>("pipeline step: the model has no parameter '{}'", path);
  return placement_->held[it->second];
}

Tree PipelineTrainStep::init_state(const Tree& params) {
  if (!multi_process_) return optimizer_.init(params);
  const Placement& p = placement_for(params);
  Tree whole;
  {
    AbstractCreationScope abstract;  // the whole structure, no data
    whole = optimizer_.init(params);
  }
  return merge_state(whole, optimizer_.init(select(params, p.held)));
}

void PipelineTrainStep::place(Tree& params, Tree& opt_state) {
  if (!multi_process_) return;
  const Placement& p = placement_for(params);
  const int me = spmd::local_devices().front();
  std::vector<Shape> param_shapes;
  for (const Array& leaf : params.leaves()) param_shapes.push_back(leaf.shape());
  auto drop = [&](const Tree& tree) {
    std::vector<Array> leaves = tree.leaves();
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (!p.held[i]) {
        leaves[i] = Array::placeholder(leaves[i].shape(), leaves[i].dtype());
      } else if (p.sharding[i] && !spmd::sharding_of(leaves[i]) && leaves[i].shape() == param_shapes[i]) {
        // Sharded state: this device's shard of the whole leaf (the rest is freed). A
        // state leaf of another shape (Adafactor's factored rows, a 0-d slot) stays whole,
        // as Layout places optimizer state in-process.
        std::vector<Array> shards(static_cast<size_t>(world_mesh_.size()));
        shards[static_cast<size_t>(me)] = spmd::shard_for_device(leaves[i], *p.sharding[i], me).eval();
        leaves[i] = spmd::make_sharded(leaves[i].shape(), leaves[i].dtype(), *p.sharding[i], std::move(shards));
      }
    }
    return tree.with_leaves(leaves);
  };
  params = drop(params);
  Tree state = Tree::dict();
  for (const auto& [slot, subtree] : opt_state.items())
    state[slot] = !subtree.is_leaf() && subtree.paths() == p.paths ? drop(subtree) : subtree;
  opt_state = state;
}

Tree PipelineTrainStep::gathered(const Tree& tree, int to) {
  if (!multi_process_) return tree;
  if (!placement_) return tree;  // nothing was placed yet: every process holds the whole tree
  const Placement& p = *placement_;
  const int me = spmd::local_devices().front();
  const std::vector<int> world = spmd::world_group();
  auto gather = [&](const Tree& like_params) {
    std::vector<Array> leaves = like_params.leaves();
    // Sharded state: first the whole leaves from the shards of each stage's devices.
    for (size_t i = 0; i < leaves.size(); ++i)
      if (const spmd::Sharding* sharding = spmd::sharding_of(leaves[i]); sharding && p.held[i])
        leaves[i] = executors_.front().whole_from_shard(spmd::addressable_shards(leaves[i]).at(static_cast<size_t>(me)),
                                                        leaves[i].shape(), leaves[i].dtype(), *sharding);
    for (size_t i = 0; i < leaves.size(); ++i) {
      const std::vector<int>& owners = p.owners[i];
      const int root = owners.front();
      const bool held_by_to = std::find(owners.begin(), owners.end(), to) != owners.end();
      // A broadcast goes from the group's first member: the root, then the receivers (every
      // other process unless all hold the leaf; or `to` unless it holds it).
      std::vector<int> group{root};
      if (to < 0 && owners.size() < world.size()) {
        for (int device : world)
          if (device != root) group.push_back(device);
      } else if (to >= 0 && !held_by_to) {
        group.push_back(to);
      }
      if (group.size() == 1 || std::find(group.begin(), group.end(), me) == group.end()) continue;
      const Array& leaf = leaves[i];
      if (me == root) {
        if (!leaf.is_evaluated()) fail<Error>("pipeline step: '{}' has no data on its holder", p.paths[i]);
        // The root only reads its buffer.
        spmd::communicator().broadcast(me, group, const_cast<void*>(leaf.raw_data()), leaf.nbytes());
      } else {
        Array received = Array::empty(leaf.shape(), leaf.dtype());
        spmd::communicator().broadcast(me, group, received.mutable_raw_data(), received.nbytes());
        leaves[i] = received;
      }
    }
    return like_params.with_leaves(leaves);
  };
  if (!tree.is_leaf() && tree.paths() == p.paths) return gather(tree);
  Tree out = Tree::dict();  // the optimizer state: its parameter-shaped slots
  for (const auto& [slot, subtree] : tree.items())
    out[slot] = !subtree.is_leaf() && subtree.paths() == p.paths ? gather(subtree) : subtree;
  return out;
}

double PipelineTrainStep::held_bytes(const Tree& tree) {
  double bytes = 0;
  for (const Array& leaf : tree.leaves()) {
    if (spmd::sharding_of(leaf)) {
      for (const Array& shard : spmd::addressable_shards(leaf))
        if (shard.valid() && shard.is_evaluated()) bytes += static_cast<double>(shard.nbytes());
    } else if (leaf.is_evaluated()) {
      bytes += static_cast<double>(leaf.nbytes());
    }
  }
  return bytes;
}

Tree PipelineTrainStep::local_shards(const Tree& tree) const {
  if (!shard_state_) return tree;
  const int me = spmd::local_devices().front();
  return tree.map([me](const Array& leaf) {
    return spmd::sharding_of(leaf) ? spmd::addressable_shards(leaf).at(static_cast<size_t>(me)) : leaf;
  });
}

Tree PipelineTrainStep::sharded_like(const Tree& local, const Tree& like) const {
  if (!shard_state_) return local;
  const int me = spmd::local_devices().front();
  std::vector<Array> leaves = local.leaves();
  const std::vector<Array> likes = like.leaves();
  for (size_t i = 0; i < leaves.size(); ++i)
    if (const spmd::Sharding* sharding = spmd::sharding_of(likes[i])) {
      std::vector<Array> shards(static_cast<size_t>(sharding->mesh().size()));
      shards[static_cast<size_t>(me)] = leaves[i];
      leaves[i] = spmd::make_sharded(likes[i].shape(), likes[i].dtype(), *sharding, std::move(shards));
    }
  return local.with_leaves(leaves);
}

}  // namespace tessera::train
