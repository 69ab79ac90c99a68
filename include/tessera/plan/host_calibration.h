// The planner's figures for a CPU host, measured on the machine that plans (no two CPU
// hosts we run on are alike, and no datasheet number says what tessera's kernels reach
// on them). The planner times every kernel of the planned program itself
// (host_kernel_seconds) and scales the sum by step factors from a reference step; the
// rates below are what it needs beside that, from a few hundred milliseconds of
// tessera's own kernels on one thread and on all of them:
//   * GEMMs of several sizes in the compute dtype, fitted to rate(f) = r_max f / (f + f_half)
//     (f: FLOPs of one GEMM): r_max is the peak MFU counts against;
//   * a streaming elementwise op for bandwidth, and a tiny op for the per-kernel overhead
//     (what kernel-less copies such as shard_slice cost);
//   * collectives between virtual devices: half the stream bandwidth and 20 us per step
//     (assumed, not yet measured).
// Several virtual devices in one process each run their kernels on one thread (spmd
// runtime), and share the host's cores: kernels are timed on one thread then, slowed by
// devices / cores when there are more devices than cores.
#pragma once

#include <string>

#include "tessera/base/dtype.h"
#include "tessera/compiler/graph.h"
#include "tessera/goodput/accelerators.h"

namespace tessera::plan {

struct KernelRates {
  double gemm_flops = 0;       // r_max of the GEMM curve (FLOP/s)
  double gemm_half_flops = 0;  // f_half: the GEMM size (FLOPs) reaching half of r_max
  double bandwidth = 0;        // bytes/s a streaming kernel reaches
  double kernel_overhead = 0;  // seconds per kernel
};

struct HostRates {
  int cores = 1;
  std::string dtype;     // the compute dtype the GEMMs were measured in
  KernelRates serial;    // one thread
  KernelRates parallel;  // all threads
  // A program runs slower than the sum of its kernels timed alone (inputs arrive from
  // other kernels, not hot in cache; the step's own work between kernels; and with
  // several devices, cores contending for caches and memory and waiting for each other).
  // Measured on a reference step (a 2-layer GPT, not one the validation plans) at three
  // batch sizes: step = overhead + GEMM kernels + factor * (its other kernels, timed
  // alone), on one device and on one and on two virtual devices per core. calibrate_host
  // leaves them 0 and 1; calibrate_host_steps measures them.
  double step_factor_one = 1, step_overhead_one = 0;  // seconds per program run
  double step_factor_many = 1, step_overhead_many = 0;
  double step_factor_over = 1, step_overhead_over = 0;  // more virtual devices than cores (2 per core)
  double collective_bandwidth = 0;                      // bytes/s per device between virtual devices
  double collective_latency = 0;                        // seconds per collective step
  double seconds = 0;                                   // spent measuring
  // A catalog-style entry for this host ("host"), its link the measured copies.
  goodput::AcceleratorSpec accelerator() const;
  std::string text() const;  // one line per figure
};

// Measures this machine for `compute_dtype` (float32, bfloat16 or float16); cached per
// process and dtype.
const HostRates& calibrate_host(DType compute_dtype);

// calibrate_host with the step factors measured (a few seconds more); cached.
const HostRates& calibrate_host_steps(DType compute_dtype);

// Seconds one kernel (`node` of `graph`) takes on this host, run by itself on inputs of
// its types (on one thread when `serial`), the best of repeated runs; cached per process
// by the kernel's signature (primitive, attributes, input types). What the planner
// costs each kernel at when it plans for this machine: the roofline is for chips it
// cannot run on.
double host_kernel_seconds(const compiler::Graph& graph, const compiler::Node& node, bool serial);

}  // namespace tessera::plan
