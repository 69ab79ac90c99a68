// `tessera k8s render [options] -- COMMAND ARGS...`: writes the Kubernetes manifests
// (an Indexed Job plus a headless Service, or a JobSet) that run `tessera launch` on N
// hosts, one pod per host (src/launch/k8s_manifest.h, docs/orchestration.md).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "launch/k8s_manifest.h"
#include "tessera/base/error.h"

namespace tessera::cli {
namespace {

struct K8sCliOptions {
  launch::K8sRenderOptions render;
  std::string format = "yaml";
  std::string out;
};

int run_render(const K8sCliOptions& options) {
  std::string text;
  try {
    text = launch::render_k8s_manifests(
        options.render, options.format == "json" ? launch::ManifestFormat::kJson : launch::ManifestFormat::kYaml);
  } catch (const ValueError& e) {
    fmt::print(stderr, "tessera k8s render: {}\n", e.what());
    return 2;
  }
  for (const std::string& warning : launch::k8s_render_warnings(options.render)) print_warning(warning);
  if (options.out.empty() || options.out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  std::ofstream file(options.out, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) fail<IOError>("cannot write {}", options.out);
  fmt::print(stderr, "tessera k8s render: wrote {} ({})\n", options.out,
             options.render.jobset ? "a JobSet" : "a headless Service and an Indexed Job");
  return 0;
}

}  // namespace

Command add_k8s_command(CLI::App& app) {
  auto options = std::make_shared<K8sCliOptions>();
  CLI::App* k8s = app.add_subcommand("k8s", "Kubernetes: render the manifests that run `tessera launch` on N hosts");
  k8s->require_subcommand(1);
  CLI::App* sub = k8s->add_subcommand(
      "render", "Write an Indexed Job + headless Service (or a JobSet) running `tessera launch` in one pod per host");
  sub->footer(
      "Each pod runs: tessera launch --nnodes N --node-rank $(JOB_COMPLETION_INDEX) --coordinator NAME-0.NAME:PORT "
      "--nproc-per-host P -- COMMAND (JobSet: NAME-workers-0-0.NAME). Exit 2 fails the job at once, a preemption "
      "is retried without counting, anything else (exit 75 included) is retried --max-restarts times. "
      "docs/orchestration.md says what was validated and what has run.");
  launch::K8sRenderOptions& o = options->render;
  sub->add_option("--name", o.name, "Job/Service (or JobSet) name: a DNS-1035 label")->capture_default_str();
  sub->add_option("--namespace", o.namespace_name, "Namespace (default: none written, kubectl's current one)");
  sub->add_option("--image", o.image, "Container image with the tessera binary (required)");
  sub->add_option("--hosts", o.hosts, "Pods, one per host (with --tpu: the slice's host count, may be omitted)");
  sub->add_option("--gpus-per-host", o.gpus_per_host, "nvidia.com/gpu per pod; one rank per GPU")
      ->capture_default_str();
  sub->add_option("--nproc-per-host", o.nproc_per_host, "Ranks per pod without GPUs (default 1)");
  sub->add_option("--tpu", o.tpu,
                  "A TPU slice type (v5p-16, v5litepod-16, v6e-8, ...): google.com/tpu chips and GKE's TPU node "
                  "selectors");
  sub->add_option("--port", o.port, "The coordinator's TCP port on pod 0")->capture_default_str();
  sub->add_option("--max-restarts", o.max_restarts,
                  "Kubernetes-level restarts: the Job's backoffLimit, or the JobSet's failurePolicy.maxRestarts")
      ->capture_default_str();
  sub->add_option("--launch-max-restarts", o.launch_max_restarts,
                  "--max-restarts of `tessera launch` inside each pod (default: launch's own)");
  sub->add_option("--run-dir", o.run_dir,
                  "--run-dir of `tessera launch` (shared storage, e.g. under --checkpoint-dir)");
  sub->add_option("--checkpoint-claim", o.checkpoint_claim,
                  "A ReadWriteMany PersistentVolumeClaim mounted at --checkpoint-dir in every pod (default: an "
                  "emptyDir per pod, lost with the pod)");
  sub->add_option("--checkpoint-dir", o.checkpoint_dir, "Where the checkpoint volume is mounted")
      ->capture_default_str();
  sub->add_option("--cpu", o.cpu, "CPU request per pod (a Kubernetes quantity: 8, 500m)");
  sub->add_option("--memory", o.memory, "Memory request per pod (a Kubernetes quantity: 64Gi)");
  sub->add_option("--termination-grace", o.termination_grace_s,
                  "Seconds between SIGTERM and SIGKILL of a pod (the workers save a checkpoint in between)")
      ->capture_default_str();
  sub->add_flag("--jobset", o.jobset, "A JobSet (jobset.x-k8s.io/v1alpha2, JobSet >= v0.10) instead of Job + Service");
  sub->add_option("--tessera-bin", o.tessera, "The tessera binary in the image")->capture_default_str();
  sub->add_option("--format", options->format, "yaml (multi-document) or json (a v1 List)")
      ->check(CLI::IsMember({"yaml", "json"}))
      ->capture_default_str();
  sub->add_option("--out,-o", options->out, "Write the manifests to this file (default: stdout)");
  add_verbatim_command(sub, o.command, "The command each pod's `tessera launch` runs (after --)");
  return Command{k8s, [options] { return run_render(*options); }};
}

}  // namespace tessera::cli
