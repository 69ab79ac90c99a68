// Kubernetes manifests that run `tessera launch` on N hosts, one pod per host, in the
// XPK/JobSet style: an Indexed Job plus a headless Service, or a JobSet.
//
// Every pod runs
//   tessera launch --nnodes N --node-rank $(JOB_COMPLETION_INDEX) --coordinator C:PORT
//                  --nproc-per-host P [--max-restarts K] [--run-dir DIR] -- COMMAND...
// where the rank is the pod's completion index (declared in the container's env from
// the downward API, expanded by Kubernetes in the command) and C is the DNS name of pod
// 0: `NAME-0.NAME` through the headless Service NAME (Indexed Job, subdomain NAME), or
// `NAME-workers-0-0.NAME` for the JobSet (JobSet names pods
// <jobset>-<replicatedJob>-<jobIndex>-<podIndex> and its subdomain defaults to the
// JobSet's name). COMMAND is passed verbatim: every `$` in it is written `$$`, which
// Kubernetes turns back into `$` instead of expanding `$(VAR)`.
//
// Failure handling (docs/orchestration.md says why):
//   Job:    exit 2 -> FailJob (a usage/config error: retrying cannot help);
//           DisruptionTarget (preemption, eviction) -> Ignore (recreated, not counted);
//           exit 75 (the launch's budget spent) and anything else -> Count, at most
//           --max-restarts times (backoffLimit).
//   JobSet: the child Job fails on any pod failure (backoffLimit 0) and JobSet
//           restarts every pod together: exit 2 -> FailJobSet; a disruption ->
//           RestartJobSetAndIgnoreMaxRestarts; the rest -> RestartJobSet, at most
//           --max-restarts times. Needs JobSet v0.10 or later (onJobFailureMessagePatterns).
#pragma once

#include <string>
#include <vector>

namespace tessera::launch {

struct K8sRenderOptions {
  std::string name = "tessera";                 // Job/Service or JobSet name: a DNS-1035 label
  std::string namespace_name;                   // empty: none written (kubectl's current namespace)
  std::string image;                            // required
  int hosts = 0;                                // pods; 0: from --tpu (required otherwise)
  int gpus_per_host = 0;                        // nvidia.com/gpu per pod
  int nproc_per_host = 0;                       // ranks per pod; 0: gpus_per_host, or 1 without GPUs
  std::string tpu;                              // a TPU slice type (known_tpu_types()), or empty
  int port = 29500;                             // the coordinator's port on pod 0
  int max_restarts = 3;                         // Kubernetes-level: Job backoffLimit / JobSet maxRestarts
  int launch_max_restarts = -1;                 // --max-restarts of `tessera launch` in each pod; -1: its default
  std::string run_dir;                          // --run-dir of `tessera launch`; empty: not passed
  std::string checkpoint_claim;                 // a ReadWriteMany PersistentVolumeClaim; empty: an emptyDir
  std::string checkpoint_dir = "/checkpoints";  // where it is mounted
  std::string cpu;                              // resource requests (Kubernetes quantities), optional
  std::string memory;
  int termination_grace_s = 120;     // SIGTERM -> SIGKILL: time for the final checkpoint
  bool jobset = false;               // a JobSet instead of Job + Service
  std::string tessera = "tessera";   // the binary in the image
  std::vector<std::string> command;  // what `tessera launch` runs (after --)
};

enum class ManifestFormat {
  kYaml,  // multi-document YAML (`---`), with comments
  kJson,  // one `v1 List` object (kubectl accepts it as well)
};

// A TPU slice type as GKE and XPK name it: the node labels a pod selects and the
// google.com/tpu chips it requests on each of `hosts` VMs.
struct TpuType {
  const char* name;         // v5p-16
  const char* accelerator;  // cloud.google.com/gke-tpu-accelerator
  const char* topology;     // cloud.google.com/gke-tpu-topology
  int hosts;
  int chips_per_host;
};
const std::vector<TpuType>& known_tpu_types();

// Throws ValueError naming the option, the value and what was expected.
void validate_k8s_options(const K8sRenderOptions& options);

// Notes for the person rendering (an emptyDir checkpoint volume, ...); empty when none.
std::vector<std::string> k8s_render_warnings(const K8sRenderOptions& options);

// The argv of each pod's container as written in the manifest (before Kubernetes
// expands $(JOB_COMPLETION_INDEX) and turns $$ into $).
std::vector<std::string> k8s_pod_command(const K8sRenderOptions& options);

// "NAME-0.NAME:PORT", or "NAME-workers-0-0.NAME:PORT" for the JobSet.
std::string k8s_coordinator(const K8sRenderOptions& options);

// Validates, then renders the manifests.
std::string render_k8s_manifests(const K8sRenderOptions& options, ManifestFormat format);

}  // namespace tessera::launch
