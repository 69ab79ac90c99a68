// Mesh: the devices of one SPMD program arranged as an n-dimensional grid with a
// name per axis (jax.sharding.Mesh). Device d sits at the row-major coordinates of
// its index: in a (data=2, model=4) mesh, device 5 is at data=1, model=1.
//
//   Mesh mesh = Mesh::parse("data=2,model=4");
//   mesh.group(5, {mesh.axis_index("model")}) == {4, 5, 6, 7}
//
// A collective "over axes A" runs within each group of devices that share every
// coordinate outside A; group() lists such a group in a fixed order (coordinates
// along A, first listed axis major), which is also the order of the blocks an
// all-gather concatenates and of the terms a reduction adds.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::spmd {

class Mesh {
 public:
  Mesh() = default;  // no mesh: size 1, no axes
  // Axis names must be unique identifiers; sizes >= 1. Throws ValueError otherwise.
  Mesh(std::vector<std::string> axis_names, std::vector<int> axis_sizes);
  // "data=2,model=4" (spaces allowed). Throws ValueError naming the bad entry.
  static Mesh parse(std::string_view text);

  int ndim() const { return static_cast<int>(names_.size()); }
  int size() const;  // number of devices (product of the sizes)
  const std::vector<std::string>& axis_names() const { return names_; }
  const std::vector<int>& axis_sizes() const { return sizes_; }
  const std::string& axis_name(int axis) const { return names_.at(static_cast<size_t>(axis)); }
  int axis_size(int axis) const { return sizes_.at(static_cast<size_t>(axis)); }
  int axis_size(std::string_view name) const { return axis_size(axis_index(name)); }
  bool has_axis(std::string_view name) const;
  // Throws ValueError "mesh (data=2, model=4) has no axis 'x'" when absent.
  int axis_index(std::string_view name) const;

  std::vector<int> coords(int device) const;
  int device(const std::vector<int>& coords) const;
  // The devices sharing `device`'s coordinates outside `axes`, ordered by their
  // coordinates along `axes` (axes[0] major). `axes` empty: {device}.
  std::vector<int> group(int device, const std::vector<int>& axes) const;
  // Position of `device` within group(device, axes).
  int index_in_group(int device, const std::vector<int>& axes) const;
  // Product of the sizes of `axes`.
  int group_size(const std::vector<int>& axes) const;

  // "(data=2, model=4)".
  std::string to_string() const;
  // "[data, model]": the names of `axes` (a collective's attribute text).
  std::string axes_text(const std::vector<int>& axes) const;
  bool operator==(const Mesh& other) const { return names_ == other.names_ && sizes_ == other.sizes_; }
  bool operator!=(const Mesh& other) const { return !(*this == other); }

 private:
  std::vector<std::string> names_;
  std::vector<int> sizes_;
};

}  // namespace tessera::spmd
