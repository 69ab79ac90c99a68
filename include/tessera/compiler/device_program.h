// DeviceProgram: a compiled program that runs on an accelerator. It is built from the
// same optimized graph and memory plan as the CPU Executable (the passes, fusion groups
// and buffer offsets are shared); only the kernels differ. jit uses one when
// JitOptions::device names a GPU.
//
// Arguments may live on the host (uploaded for the call) or already on the device (a
// previous call's outputs: read in place). Outputs stay on the device
// (backend/device_data.h) until someone reads them on the host, so a training step's
// parameters and optimizer state never leave the GPU, and a step queues its kernels
// without waiting for the GPU: reading the loss is the first synchronization.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/compiler/executable.h"

namespace tessera::compiler {

class DeviceProgram {
 public:
  virtual ~DeviceProgram() = default;
  // Same contract as Executable::run: donated arguments are invalid afterwards.
  virtual std::vector<Array> run(const std::vector<Array>& args) = 0;
  // "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string device_name() const = 0;
  // Per-kernel GPU time by op (TESSERA_PROFILE=1), like Executable::profile_text.
  virtual std::string profile_text() const = 0;
};

// Where a program runs: "cpu", "cuda" (device 0) or "cuda:N".
struct DeviceSpec {
  bool cuda = false;
  int index = 0;
  static DeviceSpec parse(const std::string& text);  // ValueError naming the text for anything else
  std::string to_string() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }
};

// The GPU program for `executable` on `device` (cuda). Throws Error when tessera was
// built without CUDA or the device is missing, and when an op of the program has no
// CUDA kernel (naming the ops).
std::shared_ptr<DeviceProgram> make_device_program(std::shared_ptr<Executable> executable, const DeviceSpec& device);

}  // namespace tessera::compiler
