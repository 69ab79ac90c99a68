// TrainConfig::validate: the checks that need the whole config (keys against each
// other, the device, the mesh, the schedule), each a ConfigError naming the keys.
#include <fmt/format.h>

#include <cmath>

#include "backend/cpu/kernels/matmul.h"
#include "backend/cpu/kernels/matmul_int8.h"
#include "tessera/base/error.h"
#include "tessera/compiler/device_program.h"
#include "tessera/spmd/mesh.h"
#include "tessera/train/config.h"
#include "train/config_checks.h"
#include "train/pipeline_config.h"

namespace tessera::train {

namespace detail {

void check_compute_dtype(const std::string& dtype, const std::string& where) {
  if (dtype != "float32" && dtype != "bfloat16" && dtype != "float16" && dtype != "auto")
    fail<ConfigError>(
        "{}: 'model.compute_dtype' = \"{}\" is unknown (expected one of: float32, bfloat16, float16, auto)", where,
        dtype);
}

void resolve_quant_mode(TrainConfig& config, const std::string& where) {
  if (config.quant_mode != "on" && config.quant_mode != "auto")
    fail<ConfigError>("{}: 'quant.mode' = \"{}\" is unknown (expected on or auto)", where, config.quant_mode);
  // int8 on the CPU's int8 units (AMX-INT8, AVX512-VNNI: 3.6x and 2x float32 sgemm as
  // measured, bench/results/2026-11-27-avx512-gemms.md); the float64 path is slower.
  if (config.quant_mode == "auto" && (config.run.device != "cpu" || !cpu::int8_gemm_path().native))
    config.model.quant_targets.clear();
}

std::string resolve_compute_dtype(const std::string& dtype, const std::string& device) {
  if (dtype != "auto") return dtype;
  // GPUs have bf16 tensor cores; a CPU gains from bf16 only where its bf16 GEMMs beat
  // float32 sgemm: AMX, or AVX512-BF16 on AMD, not on Intel (measured, matmul.h's Bf16GemmPath).
  if (device != "cpu") return "bfloat16";
  return cpu::bf16_gemm_path().faster_than_float32 ? "bfloat16" : "float32";
}

void check_remat(const std::string& remat, const std::string& where) {
  if (remat != "none" && remat != "full" && remat != "offload")
    fail<ConfigError>(
        "{}: 'model.remat' = \"{}\" is unknown (expected one of: none, full, offload; offload keeps each block's input "
        "in host memory until the backward pass)",
        where, remat);
}

}  // namespace detail

void TrainConfig::validate() const {
  detail::check_compute_dtype(model.compute_dtype, "config");
  detail::check_remat(model.remat, "config");
  if (quant_mode != "on" && quant_mode != "auto")
    fail<ConfigError>("config: 'quant.mode' = \"{}\" is unknown (expected on or auto)", quant_mode);
  try {
    models::ModelConfig resolved = model;
    resolved.compute_dtype = detail::resolve_compute_dtype(model.compute_dtype, run.device);
    resolved.validate();
    optimizer_config().validate();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    fail<ConfigError>("config: {}", e.what());
  }
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) fail<ConfigError>("config: '{}' must be positive (got {})", key, v);
  };
  try {
    compiler::DeviceSpec::parse(run.device);
  } catch (const ValueError& e) {
    fail<ConfigError>("config: 'run.device': {}", e.what());
  }
  positive("train.steps", loop.steps);
  positive("train.batch", loop.batch);
  positive("train.seq", loop.seq);
  positive("train.log_interval", loop.log_interval);
  positive("train.eval_batches", loop.eval_batches);
  if (loop.micro_batch < 0 || (loop.micro_batch > 0 && loop.batch % loop.micro_batch != 0))
    fail<ConfigError>("config: 'train.micro_batch' = {} must divide 'train.batch' = {}", loop.micro_batch, loop.batch);
  if (loop.seq > model.context)
    fail<ConfigError>("config: 'train.seq' = {} exceeds 'model.context' = {}", loop.seq, model.context);
  if (loop.eval_interval < 0) fail<ConfigError>("config: 'train.eval_interval' must be >= 0");
  if (loop.time_limit_s < 0) fail<ConfigError>("config: 'train.time_limit_s' must be >= 0");
  if (checkpoint.interval < 0 && checkpoint.interval != kAutoInterval)
    fail<ConfigError>("config: 'checkpoint.interval' must be \"auto\" or >= 0");
  if (checkpoint.keep_last < 1)
    fail<ConfigError>("config: 'checkpoint.keep_last' must be >= 1 (got {})", checkpoint.keep_last);
  if (checkpoint.keep_every < 0) fail<ConfigError>("config: 'checkpoint.keep_every' must be >= 0");
  if (checkpoint.local_interval < 0 && checkpoint.local_interval != kAutoInterval)
    fail<ConfigError>("config: 'checkpoint.local_interval' = {} must be \"auto\" or >= 0 steps (0: no local tier)",
                      checkpoint.local_interval);
  if (checkpoint.local_keep_last < 1)
    fail<ConfigError>("config: 'checkpoint.local_keep_last' must be >= 1 (got {})", checkpoint.local_keep_last);
  if (!(checkpoint.mtbf_s > 0) || !std::isfinite(checkpoint.mtbf_s))
    fail<ConfigError>("config: 'checkpoint.mtbf_s' = {} must be a finite number of seconds > 0", checkpoint.mtbf_s);
  if (run.threads < 0) fail<ConfigError>("config: 'run.threads' must be >= 0");
  if (!parallel.mesh.empty()) {
    try {
      spmd::Mesh::parse(parallel.mesh);
    } catch (const Error& e) {
      fail<ConfigError>("config: 'parallel.mesh': {}", e.what());
    }
    // A pipeline axis: its keys against the mesh, batch and model.
    if (pipeline_plan(*this) && compiler::DeviceSpec::parse(run.device).cuda)
      fail<ConfigError>(
          "config: 'parallel.mesh' = \"{}\" with 'run.device' = \"{}\": pipeline stages run on the CPU only (the "
          "GPU runs meshes of data, fsdp, tensor and expert axes); drop the pipeline axis or use run.device = "
          "\"cpu\"",
          parallel.mesh, run.device);
  }
  if (data.uses_pipeline()) data.resolved_pipeline().validate();
  if (data.val_fraction <= 0 || data.val_fraction >= 1)
    fail<ConfigError>("config: 'data.val_fraction' = {} must be in (0, 1)", data.val_fraction);
  optim::ScheduleConfig s = schedule;
  s.total_steps = loop.steps;
  try {
    s.validate();
  } catch (const Error& e) {
    fail<ConfigError>("config: {}", e.what());
  }
}

}  // namespace tessera::train
