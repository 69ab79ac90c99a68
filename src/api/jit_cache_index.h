// jit's side of the compilation cache's index (compiler/compilation_cache.h): the index
// key of a call, known without tracing, and the output tree's structure, stored so an
// index hit can rebuild the call's result tree without tracing.
#pragma once

#include <string>
#include <vector>

#include "tessera/api/jit.h"
#include "tessera/compiler/compilation_cache.h"
#include "tessera/compiler/executable.h"
#include "tessera/core/tree.h"

namespace tessera::compiler {

// `signature`: jit's in-memory key of the call (leaf types, layouts, static args).
IndexKey jit_index_key(const JitOptions& options, const Tree& args, const std::string& signature,
                       const std::vector<bool>& donated);

// A tree's structure and leaf types as text, and back (placeholder leaves); the
// reverse throws ValueError for text that is not such a tree.
std::string tree_structure_text(const Tree& tree);
Tree tree_structure_from_text(const std::string& text);

// What makes `executable` unfit to run a call with these argument leaves and donation,
// returning a tree shaped like `outputs` ("" when it fits): the index must never run a
// program of another signature.
std::string index_hit_mismatch(const Executable& executable, const std::vector<Array>& leaves,
                               const std::vector<bool>& donated, const Tree& outputs);

}  // namespace tessera::compiler
