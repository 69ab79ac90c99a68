// Internal: checks shared by the config reader (config.cpp) and
// TrainConfig::validate (config_validate.cpp).
#pragma once

#include <string>

namespace tessera::train::detail {

// ConfigError naming `where` unless `dtype` is float32, bfloat16 or float16.
void check_compute_dtype(const std::string& dtype, const std::string& where);
// model.remat: none | full | offload (ConfigError naming them otherwise).
void check_remat(const std::string& remat, const std::string& where);

}  // namespace tessera::train::detail
