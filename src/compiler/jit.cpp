#include "tessera/compiler/jit.h"

#include <fmt/format.h>

#include <chrono>

#include "compiler/lazy_graph.h"
#include "core/trace_state.h"
#include "tessera/compiler/compile.h"

namespace tessera {

namespace {

std::string signature(const std::vector<Array>& leaves, const StaticArgs& statics) {
  std::string key;
  for (const Array& a : leaves) key += type_string(a) + ";";
  key += "static=";
  for (int64_t s : statics) key += std::to_string(s) + ",";
  return key;
}

std::string join_paths(const std::vector<std::string>& paths) {
  std::string s;
  for (size_t i = 0; i < paths.size() && i < 8; ++i) s += (i ? ", " : "") + (paths[i].empty() ? "<root>" : paths[i]);
  if (paths.size() > 8) s += ", ...";
  return "[" + s + "]";
}

}  // namespace

compiler::Graph trace(const JitFn& fn, const Tree& args, const StaticArgs& statics, Tree* output_structure) {
  std::vector<Array> leaves = args.leaves();
  std::vector<Array> placeholders;
  placeholders.reserve(leaves.size());
  for (const Array& leaf : leaves) placeholders.push_back(Array::placeholder(leaf.shape(), leaf.dtype()));
  Tree out;
  {
    detail::JitTraceScope scope;
    out = fn(args.with_leaves(placeholders), statics);
  }
  std::vector<Array> outs = out.leaves();
  compiler::LazyGraph lg = compiler::build_lazy_graph(
      outs, placeholders, compiler::CapturedArrays::AsConstants, [](const Array& root, const Array& leaf) {
        fail<TransformError>(
            "jit: output {} depends on a placeholder {} that is not an argument of the "
            "jitted function (a value traced by another transform leaked into it)",
            type_string(root), type_string(leaf));
      });
  for (const Array& o : outs) lg.graph.outputs.push_back(lg.value_of(o));
  if (output_structure != nullptr) {
    std::vector<Array> shapes;
    for (const Array& o : outs) shapes.push_back(Array::placeholder(o.shape(), o.dtype()));
    *output_structure = out.with_leaves(shapes);
  }
  return std::move(lg.graph);
}

Jitted::Jitted(JitFn fn, JitOptions options) : state_(std::make_shared<State>()) {
  state_->fn = std::move(fn);
  state_->options = std::move(options);
}

Jitted::Entry& Jitted::entry_for(const Tree& args, const StaticArgs& statics) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<std::string> paths = args.paths();
  if (!s.has_structure) {
    s.structure = args;
    s.has_structure = true;
  } else if (s.structure.paths() != paths) {
    fail<ValueError>(
        "jit @{}: called with arguments of another tree structure: leaves {} (expected {} as in the first call); "
        "a jitted function takes one argument structure",
        s.options.name, join_paths(paths), join_paths(s.structure.paths()));
  }
  std::vector<Array> leaves = args.leaves();
  std::string key = signature(leaves, statics);
  auto it = s.cache.find(key);
  if (it != s.cache.end()) return it->second;

  auto start = std::chrono::steady_clock::now();
  Entry entry;
  entry.traced = trace(s.fn, args, statics, &entry.output_structure);
  entry.traced.name = s.options.name;
  ++s.traces;
  std::vector<bool> donated(leaves.size(), false);
  for (int d : s.options.donate_leaves) {
    if (d < 0 || d >= static_cast<int>(leaves.size()))
      fail<ValueError>("jit @{}: donate_leaves names leaf {} but the arguments have {} leaves", s.options.name, d,
                       leaves.size());
    donated[static_cast<size_t>(d)] = true;
  }
  entry.executable =
      std::shared_ptr<compiler::Executable>(compiler::compile(entry.traced, s.options.compile, donated).release());
  entry.executable->mutable_stats().compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s.cache.emplace(key, std::move(entry)).first->second;
}

Tree Jitted::operator()(const Tree& args, const StaticArgs& statics) {
  Entry& entry = entry_for(args, statics);
  std::vector<Array> outs = entry.executable->run(args.leaves());
  return entry.output_structure.with_leaves(outs);
}

std::vector<Array> Jitted::operator()(const std::vector<Array>& args, const StaticArgs& statics) {
  std::vector<Tree> items(args.begin(), args.end());
  return (*this)(Tree::list(std::move(items)), statics).leaves();
}

Array Jitted::operator()(const Array& x) { return (*this)(Tree(x)).leaves().at(0); }

Lowered Jitted::lowered(const Tree& args, const StaticArgs& statics) {
  Entry& entry = entry_for(args, statics);
  return Lowered(entry.traced, entry.executable);
}

Lowered Jitted::lowered(const std::vector<Array>& args, const StaticArgs& statics) {
  std::vector<Tree> items(args.begin(), args.end());
  return lowered(Tree::list(std::move(items)), statics);
}

}  // namespace tessera
