// How core reaches the layers built on it. Evaluating an Array means compiling the
// graph behind it and running the Executable (compiler/), and a leaf whose value lives
// elsewhere — in per-device shards (spmd/) or in accelerator memory (a GPU program's
// output, backend/cuda/) — is copied to the host by the layer that owns that memory.
// core cannot include those layers (they include core), so they install their
// functions here when the program starts: src/api/runtime_hooks.cpp, an object file
// every program that links `tessera` gets (CMake adds it to the program's sources).
#pragma once

#include <vector>

namespace tessera {
class Array;
}

namespace tessera::detail {

using GraphEvaluator = void (*)(const std::vector<Array>& arrays);
using HostReader = void (*)(const Array& leaf);

void install_graph_evaluator(GraphEvaluator evaluator);
void install_sharded_reader(HostReader reader);
void install_device_reader(HostReader reader);

// eval(): runs the installed evaluator. An Error when none is installed (a program
// that links the core library alone, without `tessera`).
void evaluate_graph(const std::vector<Array>& arrays);

// Fills `leaf`'s host storage from its shards or its device copy; a no-op for a leaf
// that already has host storage. An Error when the owning layer is not installed.
void read_to_host(const Array& leaf);

}  // namespace tessera::detail
