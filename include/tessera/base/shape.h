// Shape: the dims of a row-major array, with overflow-checked arithmetic and
// numpy-style broadcasting helpers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

using Shape = std::vector<int64_t>;
// Strides in elements (not bytes). A stride of 0 marks a broadcast dim.
using Strides = std::vector<int64_t>;

// Number of elements; throws ShapeError naming `op` if a dim is negative or the
// product overflows int64.
int64_t numel(const Shape& shape, std::string_view op = "shape");

// "[2, 3, 4]".
std::string to_string(const Shape& shape);

// Row-major contiguous strides for `shape`.
Strides contiguous_strides(const Shape& shape);

// Maps a possibly negative axis into [0, ndim); throws AxisError naming `op`.
int normalize_axis(int64_t axis, int64_t ndim, std::string_view op);

// Normalizes, sorts and checks for duplicates; an empty list means "all axes"
// only when `empty_means_all` is set.
std::vector<int> normalize_axes(const std::vector<int>& axes, int64_t ndim, std::string_view op,
                                bool empty_means_all = false);

// Numpy broadcasting of two shapes; throws ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

// Strides that read an array of `shape` as if it had `target` shape (broadcast dims get 0).
// `shape` must broadcast to `target`.
Strides broadcast_strides(const Shape& shape, const Shape& target);

}  // namespace tessera
