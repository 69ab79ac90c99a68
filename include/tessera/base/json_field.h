// Typed reads of JSON read from disk (manifests, heartbeats, event logs, checkpoint
// extras): a file that names a key with a value of the wrong type is damaged data, to be
// reported or skipped by the caller, never a library type_error thrown past the code
// that handles damage. nlohmann's `obj.value(key, fallback)` throws when `obj` is not an
// object or the value has another type; these do not.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace tessera {

// obj[key] as T when obj is an object holding key with a value of T's JSON type and, for
// integers, in T's range; nullopt otherwise (not an object, missing, null, another type,
// out of range). T: bool, an integer type, double/float, std::string or nlohmann::json
// (any present value).
template <class T>
std::optional<T> json_field(const nlohmann::json& obj, std::string_view key) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, nlohmann::json>) {
    return *it;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return std::nullopt;
    return it->template get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return std::nullopt;
    return it->template get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (it->is_number_unsigned()) {
      const uint64_t v = it->template get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
      return static_cast<T>(v);
    }
    if (!it->is_number_integer()) return std::nullopt;
    const int64_t v = it->template get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) return std::nullopt;
      if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
    } else {
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          v > static_cast<int64_t>(std::numeric_limits<T>::max()))
        return std::nullopt;
    }
    return static_cast<T>(v);
  } else {
    static_assert(std::is_floating_point_v<T>, "json_field: unsupported type");
    if (!it->is_number()) return std::nullopt;
    return it->template get<T>();
  }
}

// json_field, or `fallback` when the field is absent or unusable.
template <class T>
T json_field_or(const nlohmann::json& obj, std::string_view key, T fallback) {
  std::optional<T> v = json_field<T>(obj, key);
  return v ? std::move(*v) : std::move(fallback);
}

}  // namespace tessera
