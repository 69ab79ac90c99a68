// Test helper (header only; tests/spmd/test_collectives.cpp and the MPI test program
// share it): every device's deterministic local input, and each collective's expected
// local output computed element by element from its definition in float64.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "tessera/base/dtype.h"
#include "tessera/base/shape.h"
#include "tessera/core/array.h"
#include "tessera/spmd/collectives.h"
#include "tessera/spmd/communicator.h"
#include "tessera/spmd/mesh.h"

namespace tessera::spmd::testing {

// Small integers in [-8, 8]: exact in every dtype, and so are sums of up to 16 of them.
inline double input_value(int device, int64_t flat, int salt) {
  return static_cast<double>((device * 131 + flat * 7 + salt * 3) % 17) - 8.0;
}

inline std::vector<double> input_values(int device, int64_t count, int salt) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = input_value(device, i, salt);
  return v;
}

// input_values as stored in `dtype` (unsigned types saturate negatives to 0, bool
// keeps "!= 0").
inline std::vector<double> input_values(int device, int64_t count, int salt, DType dtype) {
  std::vector<double> v = input_values(device, count, salt);
  std::vector<char> bytes(v.size() * itemsize(dtype));
  convert(DType::Float64, v.data(), dtype, bytes.data(), count);
  convert(dtype, bytes.data(), DType::Float64, v.data(), count);
  return v;
}

// A leaf of `dtype` holding input_values(device, ...).
inline Array input_array(int device, const Shape& shape, DType dtype, int salt) {
  std::vector<double> v = input_values(device, numel(shape), salt);
  std::vector<char> bytes(v.size() * itemsize(dtype));
  convert(DType::Float64, v.data(), dtype, bytes.data(), static_cast<int64_t>(v.size()));
  return Array::from_data(bytes.data(), shape, dtype);
}

inline std::vector<double> as_doubles(const Array& a) {
  std::vector<double> v(static_cast<size_t>(a.size()));
  convert(a.dtype(), a.raw_data(), DType::Float64, v.data(), a.size());
  return v;
}

// Runs the one collective that produced `y` (its input an evaluated leaf) on the
// current device: its eval_cpu, as the executable engine calls it. (Not eval(): the
// eval cache hands every device thread the same executable, whose run() is serialized,
// so members of one collective would wait for each other forever.)
inline Array run_collective(const Array& y) {
  if (y.is_leaf()) return y;  // a builder over a group of one device returns its input
  Array out = Array::empty(y.shape(), y.dtype());
  std::vector<Array> outs{out};
  y.primitive()->eval_cpu(y.inputs(), outs);
  return out;
}

inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return idx;
}

inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + idx[k];
  return flat;
}

struct Case {
  CollectiveKind kind;
  std::vector<int> axes;
  int dim = -1;
  int concat = -1;
};

inline Shape output_shape(const Case& c, const Shape& in, int n) {
  Shape out = in;
  switch (c.kind) {
    case CollectiveKind::AllGather:
    case CollectiveKind::ShardPad:
      out[static_cast<size_t>(c.dim)] *= n;
      break;
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::ShardSlice:
      out[static_cast<size_t>(c.dim)] /= n;
      break;
    case CollectiveKind::AllToAll:
      out[static_cast<size_t>(c.dim)] /= n;
      out[static_cast<size_t>(c.concat)] *= n;
      break;
    case CollectiveKind::AllReduce:
      break;
  }
  return out;
}

inline Array build(const Case& c, const Array& x, const Mesh& mesh) {
  switch (c.kind) {
    case CollectiveKind::AllGather:
      return all_gather(x, mesh, c.axes, c.dim);
    case CollectiveKind::AllReduce:
      return all_reduce(x, mesh, c.axes);
    case CollectiveKind::ReduceScatter:
      return reduce_scatter(x, mesh, c.axes, c.dim);
    case CollectiveKind::AllToAll:
      return all_to_all(x, mesh, c.axes, c.dim, c.concat);
    case CollectiveKind::ShardSlice:
      return shard_slice(x, mesh, c.axes, c.dim);
    case CollectiveKind::ShardPad:
      return shard_pad(x, mesh, c.axes, c.dim);
  }
  return x;
}

// Expected local output of `c` on `device` (float64, sums in group order), from the
// definitions in collectives.h; input(d) gives device d's local input (shape `in`).
inline std::vector<double> reference(const Case& c, const Mesh& mesh, const Shape& in, int device,
                                     const std::function<std::vector<double>(int)>& input) {
  const std::vector<int> group = mesh.group(device, c.axes);
  const int n = static_cast<int>(group.size());
  const int64_t i = mesh.index_in_group(device, c.axes);
  const Shape out_shape = output_shape(c, in, n);
  std::vector<std::vector<double>> x(group.size());
  for (size_t j = 0; j < group.size(); ++j) x[j] = input(group[j]);
  const std::vector<double> own = input(device);
  const size_t d = static_cast<size_t>(c.dim < 0 ? 0 : c.dim);
  std::vector<double> out(static_cast<size_t>(numel(out_shape)));
  for (int64_t flat = 0; flat < numel(out_shape); ++flat) {
    std::vector<int64_t> idx = unravel(flat, out_shape);
    double v = 0;
    switch (c.kind) {
      case CollectiveKind::AllGather: {
        const int64_t j = idx[d] / in[d];
        idx[d] %= in[d];
        v = x[static_cast<size_t>(j)][static_cast<size_t>(ravel(idx, in))];
        break;
      }
      case CollectiveKind::AllReduce:
        for (int j = 0; j < n; ++j) v += x[static_cast<size_t>(j)][static_cast<size_t>(flat)];
        break;
      case CollectiveKind::ReduceScatter:
        idx[d] += i * (in[d] / n);
        for (int j = 0; j < n; ++j) v += x[static_cast<size_t>(j)][static_cast<size_t>(ravel(idx, in))];
        break;
      case CollectiveKind::AllToAll: {
        const size_t s = static_cast<size_t>(c.dim), k = static_cast<size_t>(c.concat);
        Shape block = in;
        block[s] /= n;
        const int64_t j = idx[k] / block[k];
        idx[k] %= block[k];
        idx[s] += i * block[s];
        v = x[static_cast<size_t>(j)][static_cast<size_t>(ravel(idx, in))];
        break;
      }
      case CollectiveKind::ShardSlice:
        idx[d] += i * (in[d] / n);
        v = own[static_cast<size_t>(ravel(idx, in))];
        break;
      case CollectiveKind::ShardPad: {
        const int64_t j = idx[d] / in[d];
        idx[d] %= in[d];
        v = j == i ? own[static_cast<size_t>(ravel(idx, in))] : 0.0;
        break;
      }
    }
    out[static_cast<size_t>(flat)] = v;
  }
  return out;
}

// ((m0 + m1) + m2) + ... in `dtype` with add_into: what every communicator must give.
inline std::vector<char> serial_sum(const std::vector<std::vector<char>>& members, size_t count, DType dtype) {
  std::vector<char> acc = members[0];
  for (size_t j = 1; j < members.size(); ++j) add_into(acc.data(), members[j].data(), count, dtype);
  return acc;
}

// Non-integer float32 values (rounding happens when they are added) for device d.
inline std::vector<char> fractional_f32(int device, size_t count) {
  std::vector<float> v(count);
  for (size_t k = 0; k < count; ++k)
    v[k] = static_cast<float>(
               static_cast<double>((int64_t{device} * 7919 + static_cast<int64_t>(k) * 104729) % 10007) / 997.0 - 5.0) *
           1.37f;
  std::vector<char> bytes(count * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// Every collective kind over every axis set of `mesh` (one axis; on 2-axis meshes each
// axis, both, and both reversed) along every dim of f32 `shape` that allows it, as
// (case, shape, dtype, salt) calls of `check` (in-process test and MPI program alike).
inline void for_each_case(const Mesh& mesh, const Shape& shape,
                          const std::function<void(const Case&, const Shape&, DType, int)>& check) {
  std::vector<std::vector<int>> axis_sets{{0}};
  if (mesh.ndim() == 2) axis_sets = {{0}, {1}, {0, 1}, {1, 0}};
  const int rank = static_cast<int>(shape.size());
  for (const auto& axes : axis_sets) {
    const int n = mesh.group_size(axes);
    for (int dim = 0; dim < rank; ++dim) {
      check({CollectiveKind::AllGather, axes, dim}, shape, DType::Float32, dim);
      check({CollectiveKind::ShardPad, axes, dim}, shape, DType::Float32, dim);
      if (shape[static_cast<size_t>(dim)] % n != 0) continue;
      check({CollectiveKind::ReduceScatter, axes, dim}, shape, DType::Float32, dim);
      check({CollectiveKind::ShardSlice, axes, dim}, shape, DType::Float32, dim);
      for (int concat = 0; concat < rank; ++concat)
        check({CollectiveKind::AllToAll, axes, dim, concat}, shape, DType::Float32, dim + concat);
    }
    check({CollectiveKind::AllReduce, axes}, shape, DType::Float32, 5);
  }
}

}  // namespace tessera::spmd::testing
