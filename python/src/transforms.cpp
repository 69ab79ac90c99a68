// The C++ transforms over flat lists of arrays. tessera/_transforms.py builds JAX's
// interface on these: pytrees are flattened to lists in Python, and the Python function
// is called back with lists of arrays (tracers, placeholders) while C++ traces it.
//
// The GIL: transforms call back into Python synchronously and keep it; a jitted call
// and evaluation release it, and a trace inside them takes it back (PythonCallable).
#include "tessera/core/transforms.h"

#include <fmt/format.h>

#include "bindings.h"
#include "tessera/api/jit.h"
#include "tessera/core/checkpoint.h"

namespace tessera::python {
namespace {

// The arrays a traced Python function returned (a list or tuple of array-likes).
std::vector<Array> result_arrays(const nb::object& result, const char* what) {
  if (nb::isinstance<Array>(result)) return {nb::cast<Array>(result)};
  return as_array_list(result, what);
}

nb::list to_list(const std::vector<Array>& arrays) {
  nb::list out;
  for (const Array& a : arrays) out.append(a);
  return out;
}

// fn(list of arrays) -> list of arrays, as the C++ ArrayFn (called with the GIL held).
ArrayFn array_fn(nb::callable fn, const char* what) {
  return [fn = std::move(fn), what](const std::vector<Array>& args) { return result_arrays(fn(to_list(args)), what); };
}

CheckpointPolicy policy_of(const std::string& kind, std::vector<std::string> names) {
  if (kind == "full") return CheckpointPolicy::full();
  if (kind == "none") return CheckpointPolicy::none();
  if (kind == "save_named") return CheckpointPolicy::save_named(std::move(names));
  if (kind == "offload") return CheckpointPolicy::offload(std::move(names));
  throw nb::value_error(
      fmt::format("checkpoint: policy must be 'full', 'none', 'save_named' or 'offload', got '{}'", kind).c_str());
}

}  // namespace

void register_transforms(nb::module_& m) {
  m.def(
      "_vjp",
      [](nb::callable fn, const std::vector<Array>& primals, const std::vector<Array>& cotangents) {
        auto [outputs, grads] = vjp(array_fn(std::move(fn), "vjp"), primals, cotangents);
        return std::make_pair(outputs, grads);
      },
      nb::arg("fn"), nb::arg("primals"), nb::arg("cotangents"));
  m.def(
      "_value_and_grad",
      [](nb::callable fn, const std::vector<Array>& args) {
        ScalarFn scalar = [fn = std::move(fn)](const std::vector<Array>& xs) {
          return as_array(fn(to_list(xs)), "grad: the function's value");
        };
        return value_and_grad(scalar)(args);
      },
      nb::arg("fn"), nb::arg("args"));
  m.def(
      "_vmap",
      [](nb::callable fn, const std::vector<Array>& args, const std::vector<std::optional<int>>& in_axes) {
        std::vector<int> axes;
        for (const auto& a : in_axes) axes.push_back(a ? *a : kNotMapped);
        return vmap(array_fn(std::move(fn), "vmap"), axes)(args);
      },
      nb::arg("fn"), nb::arg("args"), nb::arg("in_axes"));
  m.def(
      "_checkpoint",
      [](nb::callable fn, const std::vector<Array>& args, const std::string& policy, std::vector<std::string> names) {
        return checkpoint(array_fn(std::move(fn), "checkpoint"), policy_of(policy, std::move(names)))(args);
      },
      nb::arg("fn"), nb::arg("args"), nb::arg("policy"), nb::arg("names"));

  nb::class_<Lowered>(m, "Lowered", "A traced and compiled program (jit(f).lower(*args)).")
      .def("text", &Lowered::text, "The traced IR, before any pass (per device for an SPMD program).")
      .def("global_text", &Lowered::global_text, "The global traced program (SPMD programs too).")
      .def("optimized_text", &Lowered::optimized_text, "The optimized program with its buffer assignment.")
      .def("as_text", &Lowered::text);

  nb::class_<Jitted>(m, "_Jitted")
      .def(
          "__init__",
          [](Jitted* self, nb::callable fn, std::vector<int> donate,
             std::vector<std::optional<spmd::Sharding>> in_shardings,
             std::vector<std::optional<spmd::Sharding>> out_shardings, std::string device, std::string name,
             std::string cache_identity) {
            PythonCallable callable(std::move(fn));
            JitFn jit_fn = [callable](const Tree& args, const StaticArgs&) {
              std::vector<Array> leaves = args.leaves();
              std::vector<Tree> outs;
              {
                nb::gil_scoped_acquire gil;
                for (const Array& o : result_arrays(callable(to_list(leaves)), "jit")) outs.emplace_back(o);
              }
              return Tree::list(std::move(outs));
            };
            JitOptions options;
            options.donate_leaves = std::move(donate);
            options.in_shardings = std::move(in_shardings);
            options.out_shardings = std::move(out_shardings);
            options.device = std::move(device);
            options.name = std::move(name);
            options.cache_identity = std::move(cache_identity);
            new (self) Jitted(std::move(jit_fn), std::move(options));
          },
          nb::arg("fn"), nb::arg("donate"), nb::arg("in_shardings"), nb::arg("out_shardings"), nb::arg("device"),
          nb::arg("name"), nb::arg("cache_identity"))
      .def("__call__",
           [](Jitted& self, const std::vector<Array>& args) {
             std::vector<Array> outs;
             {
               nb::gil_scoped_release release;
               outs = self(args);
             }
             return outs;
           })
      .def("lower",
           [](Jitted& self, const std::vector<Array>& args) {
             nb::gil_scoped_release release;
             return self.lowered(args);
           })
      .def_prop_ro("trace_count", &Jitted::trace_count)
      .def_prop_ro("cache_size", &Jitted::cache_size)
      .def("profile_text", &Jitted::profile_text);
}

}  // namespace tessera::python
