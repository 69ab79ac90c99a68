// tessera.compilation_cache: the persistent cache of compiled programs jit uses (set
// with set_dir or TESSERA_COMPILATION_CACHE_DIR). A Python process traces a function
// on its first call and loads the compiled program another process stored.
#include "tessera/compiler/compilation_cache.h"

#include "bindings.h"

namespace tessera::python {

void register_compilation_cache(nb::module_& m) {
  nb::module_ c = m.def_submodule("_compilation_cache");
  c.def(
      "set_dir", [](const std::string& dir, uint64_t max_mb) { compiler::set_compilation_cache(dir, max_mb << 20); },
      nb::arg("dir"), nb::arg("max_mb") = compiler::kDefaultCompilationCacheBytes >> 20,
      "Uses `dir` for the persistent compilation cache (\"\" turns it off).");
  c.def("stats", [] {
    const compiler::CompilationCacheStats s = compiler::compilation_cache_stats();
    nb::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["corrupt"] = s.corrupt;
    d["stores"] = s.stores;
    d["store_failures"] = s.store_failures;
    d["evictions"] = s.evictions;
    d["skipped"] = s.skipped;
    return d;
  });
}

}  // namespace tessera::python
