// Every TESSERA_* environment variable tessera reads or sets, declared once with its
// default and what it does (src/base/flags.cpp). Code reads them through env(), which
// refuses a name that is not declared, and a test refuses a "TESSERA_..." name in the
// sources that is not declared; `tessera info --flags` lists them, and docs/flags.md is
// that listing (a test compares the two).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tessera::flags {

struct Flag {
  std::string_view name;           // "TESSERA_NUM_THREADS"
  std::string_view default_value;  // as a user would write it; "" when unset means off
  std::string_view doc;            // one sentence or two: what it does, which values
  std::string_view set_by;         // "" (the user), or who sets it ("tessera launch")
};

// The declared flags, sorted by name.
std::span<const Flag> all();

// The declaration of `name`; nullptr when it is not declared.
const Flag* find(std::string_view name);

// getenv(name) for a declared TESSERA_* flag: the value, or nullptr when unset. Other
// names (RANK, OMPI_COMM_WORLD_RANK, ...) are read as they are. An Error naming the
// variable for an undeclared TESSERA_* name (a programming error, caught by the tests).
const char* env(const char* name);

// env(name) read as an integer in [min, max]; `fallback` when unset or empty. A
// ValueError naming the variable, its value and the range (with `what`, what the number
// counts) for anything else.
int64_t env_integer(const char* name, int64_t fallback, int64_t min, int64_t max, const char* what);

// The first of `names` (launchers' variables, e.g. OMPI_COMM_WORLD_RANK, PMI_RANK) set to
// a whole number in [min, max], read through env(); nullopt when none is. Leniently: a
// variable set to anything else is skipped, as another launcher may use the name for
// something else.
std::optional<int64_t> first_env_integer(std::initializer_list<const char*> names, int64_t min, int64_t max);

// The listing `tessera info --flags` prints: a Markdown table (name, default, set by,
// what it does), and with `with_values` a last column with this process's values.
std::string table(bool with_values);

}  // namespace tessera::flags
