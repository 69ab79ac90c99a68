// Internal: checks shared by the config reader (config.cpp) and
// TrainConfig::validate (config_validate.cpp).
#pragma once

#include <string>

#include "tessera/train/config.h"

namespace tessera::train::detail {

// ConfigError naming `where` unless `dtype` is float32, bfloat16, float16 or auto.
void check_compute_dtype(const std::string& dtype, const std::string& where);
// model.compute_dtype "auto": bfloat16 on a GPU or on a CPU with bf16 matrix units
// (AMX-BF16: `tessera info`'s "bf16 GEMM" line), else float32. Other values unchanged.
std::string resolve_compute_dtype(const std::string& dtype, const std::string& device);
// quant.mode "auto" on a machine without int8 matrix units: model.quant_targets cleared.
// ConfigError for a mode other than on / auto.
void resolve_quant_mode(TrainConfig& config, const std::string& where);
// model.remat: none | full | offload (ConfigError naming them otherwise).
void check_remat(const std::string& remat, const std::string& where);

}  // namespace tessera::train::detail
