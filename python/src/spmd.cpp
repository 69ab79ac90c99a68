// SPMD from Python: Mesh, PartitionSpec, NamedSharding and the sharded arrays of
// spmd/api.h (device_put, with_sharding_constraint). tessera/sharding.py gives them
// JAX's spellings (P, make_mesh).
#include <fmt/format.h>

#include "bindings.h"
#include "tessera/spmd/api.h"
#include "tessera/spmd/runtime.h"
#include "tessera/spmd/sharding.h"

namespace tessera::python {
namespace {

// One PartitionSpec entry: None, an axis name, or a tuple/list of axis names.
spmd::Axes spec_entry(nb::handle entry, size_t dim) {
  if (entry.is_none()) return {};
  if (nb::isinstance<nb::str>(entry)) return {nb::cast<std::string>(entry)};
  spmd::Axes axes;
  try {
    for (nb::handle a : nb::iter(entry)) axes.push_back(nb::cast<std::string>(a));
  } catch (const std::exception&) {
    throw nb::type_error(fmt::format("PartitionSpec: entry {} must be None, a mesh axis name or a tuple of names, "
                                     "got {}",
                                     dim, nb::cast<std::string>(nb::repr(entry)))
                             .c_str());
  }
  return axes;
}

nb::tuple spec_tuple(const spmd::PartitionSpec& spec) {
  nb::list entries;
  for (const spmd::Axes& axes : spec.dims) {
    if (axes.empty()) {
      entries.append(nb::none());
    } else if (axes.size() == 1) {
      entries.append(axes[0]);
    } else {
      nb::list names;
      for (const std::string& a : axes) names.append(a);
      entries.append(nb::tuple(names));
    }
  }
  return nb::tuple(entries);
}

}  // namespace

void register_spmd(nb::module_& m) {
  using namespace spmd;
  nb::class_<Mesh>(m, "Mesh", "Devices as an n-dimensional grid with a name per axis (jax.sharding.Mesh).")
      .def(
          "__init__",
          [](Mesh* self, nb::handle axis_sizes, std::vector<std::string> axis_names) {
            std::vector<int> sizes;
            for (int64_t s : as_shape(axis_sizes, "Mesh: axis sizes")) sizes.push_back(static_cast<int>(s));
            if (sizes.size() != axis_names.size())
              throw nb::value_error(
                  fmt::format("Mesh: {} axis sizes for {} axis names", sizes.size(), axis_names.size()).c_str());
            new (self) Mesh(std::move(axis_names), std::move(sizes));
          },
          nb::arg("axis_sizes"), nb::arg("axis_names"), "Mesh((2, 4), ('data', 'model')): 8 devices, data-major.")
      .def_static("parse", &Mesh::parse, nb::arg("text"), "Mesh.parse('data=2,model=4').")
      .def_prop_ro("axis_names", [](const Mesh& mesh) { return nb::tuple(nb::cast(mesh.axis_names())); })
      .def_prop_ro("axis_sizes", [](const Mesh& mesh) { return nb::tuple(nb::cast(mesh.axis_sizes())); })
      .def_prop_ro("shape",
                   [](const Mesh& mesh) {
                     nb::dict shape;
                     for (int a = 0; a < mesh.ndim(); ++a)
                       shape[nb::str(mesh.axis_name(a).c_str())] = mesh.axis_size(a);
                     return shape;
                   })
      .def_prop_ro("size", &Mesh::size)
      .def_prop_ro("ndim", &Mesh::ndim)
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; })
      .def("__repr__", [](const Mesh& mesh) { return "Mesh" + mesh.to_string(); });

  nb::class_<PartitionSpec>(m, "PartitionSpec",
                            "How each array dimension is split over mesh axes: P('data', None, ('a', 'b')).")
      .def("__init__",
           [](PartitionSpec* self, nb::args entries) {
             PartitionSpec spec;
             for (size_t i = 0; i < entries.size(); ++i) spec.dims.push_back(spec_entry(entries[i], i));
             new (self) PartitionSpec(std::move(spec));
           })
      .def("__len__", [](const PartitionSpec& spec) { return spec.dims.size(); })
      .def("__iter__", [](const PartitionSpec& spec) { return nb::iter(spec_tuple(spec)); })
      .def("__getitem__",
           [](const PartitionSpec& spec, nb::handle index) { return spec_tuple(spec).attr("__getitem__")(index); })
      .def("__eq__", [](const PartitionSpec& a, const PartitionSpec& b) { return a == b; })
      .def("__repr__", &PartitionSpec::to_string);

  nb::class_<Sharding>(m, "Sharding",
                       "A layout resolved for an array's rank: per dimension the mesh axes "
                       "splitting it, and the axes holding partial sums.")
      .def_prop_ro("mesh", &Sharding::mesh)
      .def_prop_ro("spec", &Sharding::spec)
      .def_prop_ro("is_replicated", &Sharding::is_replicated)
      .def_prop_ro("is_partial", &Sharding::is_partial)
      .def("shard_shape", [](const Sharding& s,
                             nb::handle shape) { return shape_tuple(s.local_shape(as_shape(shape, "shard_shape"))); })
      .def("__eq__", [](const Sharding& a, const Sharding& b) { return a == b; })
      .def("__repr__", &Sharding::to_string);

  nb::class_<NamedSharding>(m, "NamedSharding", "A mesh and a PartitionSpec (jax.sharding.NamedSharding).")
      .def(nb::init<Mesh, PartitionSpec>(), nb::arg("mesh"), nb::arg("spec"))
      .def_prop_ro("mesh", &NamedSharding::mesh)
      .def_prop_ro("spec", &NamedSharding::spec)
      .def("resolve", &NamedSharding::resolve, nb::arg("rank"), nb::arg("what") = "array",
           "The Sharding for an array of `rank` dimensions (errors name `what`).")
      .def("shard_shape",
           [](const NamedSharding& s, nb::handle shape) {
             Shape global = as_shape(shape, "shard_shape");
             return shape_tuple(s.resolve(static_cast<int>(global.size())).local_shape(global));
           })
      .def("__eq__",
           [](const NamedSharding& a, const NamedSharding& b) { return a.mesh() == b.mesh() && a.spec() == b.spec(); })
      .def("__repr__", &NamedSharding::to_string);

  m.def(
      "device_put",
      [](nb::handle x, const NamedSharding& sharding) {
        Array a = as_array(x, "device_put");
        nb::gil_scoped_release release;
        return spmd::device_put(a, sharding);
      },
      nb::arg("x"), nb::arg("sharding"), "Splits x over the mesh (jax.device_put); a sharded x is resharded.");
  m.def(
      "with_sharding_constraint",
      [](nb::handle x, const NamedSharding& sharding) {
        return spmd::with_sharding_constraint(as_array(x, "with_sharding_constraint"), sharding);
      },
      nb::arg("x"), nb::arg("shardings"), "Inside jit: the value must have this layout here. Outside: device_put.");
  m.def("_sharding_of", [](const Array& x) -> std::optional<Sharding> {
    const Sharding* s = spmd::sharding_of(x);
    return s ? std::optional<Sharding>(*s) : std::nullopt;
  });
  m.def("_addressable_shards", [](const Array& x) { return spmd::addressable_shards(x); });
  m.def("device_count", &spmd::device_count, "Devices of this runtime (TESSERA_CPU_DEVICES virtual CPU devices).");
  m.def("_set_cpu_devices", &spmd::set_cpu_devices, nb::arg("n"));
}

}  // namespace tessera::python
