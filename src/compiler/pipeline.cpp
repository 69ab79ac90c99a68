#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tessera/base/error.h"
#include "tessera/base/flags.h"
#include "tessera/compiler/pass.h"

namespace tessera::compiler {

void Pipeline::run(Graph& graph, const std::string& dump_dir) const {
  std::string dir = dump_dir;
  if (dir.empty()) {
    const char* env = flags::env("TESSERA_DUMP");
    if (env != nullptr) dir = env;
  }
  // Each compilation gets its own number, so successive eval() compiles (all named
  // "eval") do not overwrite each other: dir/<graph>.<compile>.<NN>.<pass>.txt.
  static std::atomic<int> compilations{0};
  const int compilation = dir.empty() ? 0 : compilations.fetch_add(1);
  auto dump = [&](int index, const std::string& pass_name) {
    if (dir.empty()) return;
    std::filesystem::create_directories(dir);
    std::string path = fmt::format("{}/{}.{:04d}.{:02d}.{}.txt", dir, graph.name, compilation, index, pass_name);
    std::ofstream out(path);
    if (!out) fail<ValueError>("TESSERA_DUMP: cannot write {}", path);
    out << graph.text();
  };
  graph.verify();
  dump(0, "traced");
  for (size_t i = 0; i < passes_.size(); ++i) {
    passes_[i]->run(graph);
    try {
      graph.verify();
    } catch (const Error& e) {
      fail<Error>("pass {} produced an invalid graph: {}", passes_[i]->name(), e.what());
    }
    dump(static_cast<int>(i) + 1, passes_[i]->name());
  }
}

std::string Pipeline::text() const {
  std::string s;
  for (const PassPtr& p : passes_) s += (s.empty() ? "" : " -> ") + p->name();
  return s;
}

}  // namespace tessera::compiler
