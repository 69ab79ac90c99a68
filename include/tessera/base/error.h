// Errors that carry context: what was wrong, where (op, shapes, field), what was expected.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tessera {

// Base class of every error tessera throws. The message is complete and
// human-readable: "<op>: <what> (got <...>; expected <...>)".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Incompatible or invalid shapes (broadcasting, matmul dims, reshape sizes, overflow).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A dtype the op does not support, or a bad mix of dtypes.
class DTypeError : public Error {
 public:
  using Error::Error;
};

// An axis out of range or repeated.
class AxisError : public Error {
 public:
  using Error::Error;
};

// A bad argument value (negative size, bad probability, bad index...).
class ValueError : public Error {
 public:
  using Error::Error;
};

// A transform that cannot be applied (grad of a non-differentiable op, vmap without a rule...).
class TransformError : public Error {
 public:
  using Error::Error;
};

// A file or directory that cannot be read or written, or whose contents are corrupt
// (bad magic, truncated, checksum mismatch). The message names the path.
class IOError : public Error {
 public:
  using Error::Error;
};

// A configuration problem: an unknown or mistyped key, a value of the wrong type or
// out of range. The message names the file:line and the key.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Throws E with a fmt-formatted message.
template <typename E = Error, typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw E(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tessera
