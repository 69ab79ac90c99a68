// tessera.goodput from Python: the Recorder that writes RUN_DIR/goodput/events.jsonl
// (the log `tessera goodput` reports on) from any training loop, PyTorch's and JAX's
// included, and the report of a run directory.
#include <nanobind/stl/filesystem.h>

#include "bindings.h"
#include "tessera/goodput/calculator.h"
#include "tessera/goodput/recorder.h"
#include "tessera/goodput/report.h"

namespace tessera::python {

void register_goodput(nb::module_& m) {
  using goodput::Recorder;
  using goodput::SavePart;
  nb::module_ g = m.def_submodule("_goodput");
  nb::class_<Recorder>(g, "Recorder")
      .def(nb::init<const std::filesystem::path&>(), nb::arg("run_dir"))
      .def_prop_ro("path", &Recorder::path)
      .def_prop_ro("attempt", &Recorder::attempt)
      .def(
          "job_start", [](Recorder& r, const std::string& name) { r.job_start(name); }, nb::arg("job_name") = "")
      .def(
          "attempt_start", [](Recorder& r, const std::string& reason) { r.attempt_start(reason); },
          nb::arg("reason") = "")
      .def("backend_init_start", &Recorder::backend_init_start)
      .def(
          "backend_init_end", [](Recorder& r, const std::string& backend) { r.backend_init_end(backend); },
          nb::arg("backend") = "")
      .def(
          "compile_start", [](Recorder& r, const std::string& what) { r.compile_start(what); }, nb::arg("what") = "")
      .def("compile_end", &Recorder::compile_end, nb::arg("cache_hit") = false)
      .def("checkpoint_restore_start", &Recorder::checkpoint_restore_start, nb::arg("step"))
      .def("checkpoint_restore_end", &Recorder::checkpoint_restore_end, nb::arg("step"))
      .def(
          "checkpoint_save_start",
          [](Recorder& r, int64_t step, bool background) {
            r.checkpoint_save_start(step, background ? SavePart::kBackground : SavePart::kBlocking);
          },
          nb::arg("step"), nb::arg("background") = false)
      .def(
          "checkpoint_save_end",
          [](Recorder& r, int64_t step, bool background, bool committed) {
            r.checkpoint_save_end(step, background ? SavePart::kBackground : SavePart::kBlocking, committed);
          },
          nb::arg("step"), nb::arg("background") = false, nb::arg("committed") = true)
      .def("data_wait_start", &Recorder::data_wait_start)
      .def("data_wait_end", &Recorder::data_wait_end)
      .def("step_start", &Recorder::step_start, nb::arg("step"))
      .def("step_end", &Recorder::step_end, nb::arg("step"), nb::arg("tokens") = 0, nb::arg("model_flops") = 0.0,
           nb::arg("pipeline_bubble") = -1.0)
      .def("eval_start", &Recorder::eval_start)
      .def("eval_end", &Recorder::eval_end)
      .def(
          "failure",
          [](Recorder& r, int signal, int exit_code, const std::string& message) {
            r.failure(signal, exit_code, message);
          },
          nb::arg("signal") = 0, nb::arg("exit_code") = 1, nb::arg("message") = "")
      .def(
          "custom_badput_start", [](Recorder& r, const std::string& type) { r.custom_badput_start(type); },
          nb::arg("type"))
      .def(
          "custom_badput_end", [](Recorder& r, const std::string& type) { r.custom_badput_end(type); }, nb::arg("type"))
      .def("job_end", &Recorder::job_end, nb::arg("ok") = true);
  g.def(
      "report_table",
      [](const std::filesystem::path& run_dir) { return goodput::format_table(goodput::report_for_run(run_dir)); },
      nb::arg("run_dir"));
  g.def(
      "report_json",
      [](const std::filesystem::path& run_dir) {
        return goodput::report_to_json(goodput::report_for_run(run_dir)).dump();
      },
      nb::arg("run_dir"));
}

}  // namespace tessera::python
