// The Kubernetes manifests of `tessera k8s render` (launch/k8s_manifest.h): their shape,
// read back through the JSON form, the YAML quoting of awkward command arguments, and
// every error. tests/oracles/k8s_manifests.py validates the same manifests against the
// Kubernetes schemas; tests/cli/k8s_cli_test.sh expands each pod's command as Kubernetes
// would and checks it is the `tessera launch` command expected.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/k8s_manifest.h"
#include "tessera/base/error.h"

namespace tessera::launch {
namespace {

using nlohmann::json;

K8sRenderOptions cpu_job() {
  K8sRenderOptions o;
  o.name = "train";
  o.image = "registry.example/tessera:1";
  o.hosts = 3;
  o.command = {"tessera", "train", "--config", "configs/tiny.toml"};
  return o;
}

json documents(const K8sRenderOptions& o) {
  return json::parse(render_k8s_manifests(o, ManifestFormat::kJson)).at("items");
}

json& pod_spec_of_job(json& job) { return job["spec"]["template"]["spec"]; }

TEST(K8sManifest, IndexedJobAndHeadlessService) {
  const json docs = documents(cpu_job());
  ASSERT_EQ(docs.size(), 2u);
  const json& service = docs[0];
  EXPECT_EQ(service["kind"], "Service");
  EXPECT_EQ(service["metadata"]["name"], "train");
  EXPECT_EQ(service["spec"]["clusterIP"], "None");
  EXPECT_EQ(service["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(service["spec"]["selector"]["batch.kubernetes.io/job-name"], "train");
  json job = docs[1];
  EXPECT_EQ(job["apiVersion"], "batch/v1");
  EXPECT_EQ(job["kind"], "Job");
  EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
  EXPECT_EQ(job["spec"]["completions"], 3);
  EXPECT_EQ(job["spec"]["parallelism"], 3);
  const json& pod = pod_spec_of_job(job);
  EXPECT_EQ(pod["subdomain"], "train");
  EXPECT_EQ(pod["restartPolicy"], "Never");
  const json& env = pod["containers"][0]["env"][0];
  EXPECT_EQ(env["name"], "JOB_COMPLETION_INDEX");
  EXPECT_EQ(env["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_FALSE(docs[1]["metadata"].contains("namespace"));
}

TEST(K8sManifest, PodsRunLaunchWithTheirIndexAndPodZeroAsCoordinator) {
  K8sRenderOptions o = cpu_job();
  const std::vector<std::string> expected = {"tessera",
                                             "launch",
                                             "--nnodes",
                                             "3",
                                             "--node-rank",
                                             "$(JOB_COMPLETION_INDEX)",
                                             "--coordinator",
                                             "train-0.train:29500",
                                             "--nproc-per-host",
                                             "1",
                                             "--",
                                             "tessera",
                                             "train",
                                             "--config",
                                             "configs/tiny.toml"};
  EXPECT_EQ(k8s_pod_command(o), expected);
  json docs = documents(o);
  EXPECT_EQ(pod_spec_of_job(docs[1])["containers"][0]["command"].get<std::vector<std::string>>(), expected);

  o.port = 1234;
  o.launch_max_restarts = 5;
  o.run_dir = "/checkpoints/run";
  o.nproc_per_host = 2;
  EXPECT_EQ(k8s_coordinator(o), "train-0.train:1234");
  const std::vector<std::string> with_options = {"tessera",
                                                 "launch",
                                                 "--nnodes",
                                                 "3",
                                                 "--node-rank",
                                                 "$(JOB_COMPLETION_INDEX)",
                                                 "--coordinator",
                                                 "train-0.train:1234",
                                                 "--nproc-per-host",
                                                 "2",
                                                 "--max-restarts",
                                                 "5",
                                                 "--run-dir",
                                                 "/checkpoints/run",
                                                 "--",
                                                 "tessera",
                                                 "train",
                                                 "--config",
                                                 "configs/tiny.toml"};
  EXPECT_EQ(k8s_pod_command(o), with_options);
}

TEST(K8sManifest, JobFailurePolicyFailsOnUsageErrorsAndIgnoresDisruptions) {
  K8sRenderOptions o = cpu_job();
  o.max_restarts = 4;
  const json job = documents(o)[1];
  EXPECT_EQ(job["spec"]["backoffLimit"], 4);
  const json& rules = job["spec"]["podFailurePolicy"]["rules"];
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[0]["action"], "FailJob");
  EXPECT_EQ(rules[0]["onExitCodes"], json::parse(R"({"containerName":"tessera","operator":"In","values":[2]})"));
  EXPECT_EQ(rules[1]["action"], "Ignore");
  EXPECT_EQ(rules[1]["onPodConditions"], json::parse(R"([{"type":"DisruptionTarget","status":"True"}])"));
  EXPECT_EQ(rules[2]["action"], "Count");
  EXPECT_EQ(rules[2]["onExitCodes"]["values"], json::parse("[75]"));
}

TEST(K8sManifest, JobSetRestartsTheWholeSet) {
  K8sRenderOptions o = cpu_job();
  o.jobset = true;
  o.max_restarts = 2;
  EXPECT_EQ(k8s_coordinator(o), "train-workers-0-0.train:29500");
  const json docs = documents(o);
  ASSERT_EQ(docs.size(), 1u);
  const json& set = docs[0];
  EXPECT_EQ(set["apiVersion"], "jobset.x-k8s.io/v1alpha2");
  EXPECT_EQ(set["kind"], "JobSet");
  EXPECT_EQ(set["spec"]["network"]["enableDNSHostnames"], true);
  const json& policy = set["spec"]["failurePolicy"];
  EXPECT_EQ(policy["maxRestarts"], 2);
  ASSERT_EQ(policy["rules"].size(), 2u);
  EXPECT_EQ(policy["rules"][0]["name"], "UsageError");
  EXPECT_EQ(policy["rules"][0]["action"], "FailJobSet");
  EXPECT_EQ(policy["rules"][0]["onJobFailureMessagePatterns"][0], "matching FailJob rule at index 0$");
  EXPECT_EQ(policy["rules"][1]["action"], "RestartJobSetAndIgnoreMaxRestarts");
  EXPECT_EQ(policy["rules"][1]["onJobFailureMessagePatterns"][0], "matching FailJob rule at index 1$");
  const json& replicated = set["spec"]["replicatedJobs"][0];
  EXPECT_EQ(replicated["name"], "workers");
  EXPECT_EQ(replicated["replicas"], 1);
  const json& job = replicated["template"]["spec"];
  EXPECT_EQ(job["completionMode"], "Indexed");
  EXPECT_EQ(job["completions"], 3);
  EXPECT_EQ(job["parallelism"], 3);
  EXPECT_EQ(job["backoffLimit"], 0);
  // The pod rules' indexes are what the JobSet rules match: 0 exit 2, 1 a disruption.
  EXPECT_EQ(job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"], json::parse("[2]"));
  EXPECT_EQ(job["podFailurePolicy"]["rules"][1]["onPodConditions"][0]["type"], "DisruptionTarget");
  EXPECT_EQ(job["podFailurePolicy"]["rules"][1]["action"], "FailJob");
  EXPECT_FALSE(job["template"]["spec"].contains("subdomain"));  // JobSet sets it
  const auto command = job["template"]["spec"]["containers"][0]["command"].get<std::vector<std::string>>();
  EXPECT_EQ(command[7], "train-workers-0-0.train:29500");
}

TEST(K8sManifest, GpuResources) {
  K8sRenderOptions o = cpu_job();
  o.gpus_per_host = 8;
  o.cpu = "90";
  o.memory = "900Gi";
  json docs = documents(o);
  const json& container = pod_spec_of_job(docs[1])["containers"][0];
  EXPECT_EQ(container["resources"]["limits"], json::parse(R"({"nvidia.com/gpu": 8})"));
  EXPECT_EQ(container["resources"]["requests"], json::parse(R"({"cpu": "90", "memory": "900Gi"})"));
  EXPECT_EQ(k8s_pod_command(o)[9], "8");  // --nproc-per-host: one rank per GPU
  EXPECT_FALSE(pod_spec_of_job(docs[1]).contains("nodeSelector"));
  const auto warnings = k8s_render_warnings(o);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[1].find("GPU SPMD (issue 27)"), std::string::npos);
}

TEST(K8sManifest, TpuSliceGivesHostsChipsAndNodeSelectors) {
  K8sRenderOptions o = cpu_job();
  o.hosts = 0;
  o.tpu = "v5p-16";
  json docs = documents(o);
  EXPECT_EQ(docs[1]["spec"]["completions"], 2);
  const json& pod = pod_spec_of_job(docs[1]);
  EXPECT_EQ(pod["nodeSelector"], json::parse(R"({"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                                 "cloud.google.com/gke-tpu-topology": "2x2x2"})"));
  EXPECT_EQ(pod["containers"][0]["resources"]["limits"], json::parse(R"({"google.com/tpu": 4})"));
  o.tpu = "v5litepod-16";
  o.hosts = 4;  // may also be given, when it agrees
  docs = documents(o);
  EXPECT_EQ(docs[1]["spec"]["parallelism"], 4);
  EXPECT_EQ(pod_spec_of_job(docs[1])["nodeSelector"]["cloud.google.com/gke-tpu-topology"], "4x4");
}

TEST(K8sManifest, CheckpointVolume) {
  K8sRenderOptions o = cpu_job();
  json docs = documents(o);
  EXPECT_EQ(pod_spec_of_job(docs[1])["volumes"][0], json::parse(R"({"name": "checkpoints", "emptyDir": {}})"));
  EXPECT_NE(k8s_render_warnings(o).at(0).find("emptyDir"), std::string::npos);
  o.checkpoint_claim = "ckpt-rwx";
  o.checkpoint_dir = "/mnt/ckpt";
  docs = documents(o);
  const json& pod = pod_spec_of_job(docs[1]);
  EXPECT_EQ(pod["volumes"][0]["persistentVolumeClaim"]["claimName"], "ckpt-rwx");
  EXPECT_EQ(pod["containers"][0]["volumeMounts"][0]["mountPath"], "/mnt/ckpt");
  EXPECT_TRUE(k8s_render_warnings(o).empty());
}

TEST(K8sManifest, AwkwardArgumentsAreQuotedAndPassedVerbatim) {
  K8sRenderOptions o = cpu_job();
  o.namespace_name = "ml";
  o.command = {"sh",          "-c",        "echo \"a: b\" # not a comment\nexit 0",
               "key: value",  "-leading",  "$(HOME)",
               "$$",          "yes",       "2",
               "null",        "tab\there", "caf\xc3\xa9",
               "back\\slash", "'single'",  ""};
  const std::string yaml = render_k8s_manifests(o, ManifestFormat::kYaml);
  for (const char* line : {"- sh\n", "- \"-c\"\n", "- \"echo \\\"a: b\\\" # not a comment\\nexit 0\"\n",
                           "- \"key: value\"\n", "- \"-leading\"\n", "- \"$$(HOME)\"\n", "- \"$$$$\"\n", "- \"yes\"\n",
                           "- \"2\"\n", "- \"null\"\n", "- \"tab\\there\"\n", "- \"caf\xc3\xa9\"\n",
                           "- \"back\\\\slash\"\n", "- \"'single'\"\n", "- \"\"\n", "namespace: ml\n", "---\n"})
    EXPECT_NE(yaml.find(line), std::string::npos) << "missing " << line << " in\n" << yaml;
  // The JSON form carries the same strings; only `$` is doubled (Kubernetes halves it).
  json docs = documents(o);
  const auto command = pod_spec_of_job(docs[1])["containers"][0]["command"].get<std::vector<std::string>>();
  const std::vector<std::string> tail(command.end() - static_cast<long>(o.command.size()), command.end());
  std::vector<std::string> escaped = o.command;
  escaped[5] = "$$(HOME)";
  escaped[6] = "$$$$";
  EXPECT_EQ(tail, escaped);
}

TEST(K8sManifest, YamlNeverLeavesAValueThatReadsAsAnotherType) {
  K8sRenderOptions o = cpu_job();
  const std::string yaml = render_k8s_manifests(o, ManifestFormat::kYaml);
  EXPECT_NE(yaml.find("- \"3\"\n"), std::string::npos);  // --nnodes 3: a string in the command
  EXPECT_NE(yaml.find("completions: 3\n"), std::string::npos);
  EXPECT_NE(yaml.find("status: \"True\"\n"), std::string::npos);
  EXPECT_NE(yaml.find("fieldPath: \"metadata.annotations['batch.kubernetes.io/job-completion-index']\"\n"),
            std::string::npos);
  EXPECT_EQ(yaml.rfind("# Rendered by `tessera k8s render`", 0), 0u);
}

struct BadCase {
  const char* what;
  std::function<void(K8sRenderOptions&)> change;
  const char* message;
};

TEST(K8sManifest, EveryBadOptionIsAClearError) {
  const std::vector<BadCase> cases = {
      {"uppercase name", [](auto& o) { o.name = "Train"; }, "--name 'Train': expected a DNS-1035 label"},
      {"digit first", [](auto& o) { o.name = "1train"; }, "--name '1train': expected a DNS-1035 label"},
      {"underscore", [](auto& o) { o.name = "my_job"; }, "--name 'my_job'"},
      {"trailing dash", [](auto& o) { o.name = "job-"; }, "--name 'job-'"},
      {"too long", [](auto& o) { o.name = std::string(62, 'a'); },
       "the last pod's hostname NAME-2 must fit in 63 characters, so NAME can have at most 61 here"},
      {"too long for JobSet",
       [](auto& o) {
         o.name = std::string(46, 'a');
         o.jobset = true;
       },
       "the last pod's name NAME-workers-0-2-xxxxx must fit in 63 characters, so NAME can have at most 45"},
      {"namespace", [](auto& o) { o.namespace_name = "ML"; }, "--namespace 'ML': expected a DNS-1123 label"},
      {"no image", [](auto& o) { o.image = ""; }, "--image is required"},
      {"image with a space", [](auto& o) { o.image = "a b"; }, "--image 'a b': expected an image reference"},
      {"no hosts", [](auto& o) { o.hosts = 0; }, "--hosts 0: expected the number of pods, one per host (>= 1)"},
      {"negative hosts", [](auto& o) { o.hosts = -2; }, "--hosts -2"},
      {"unknown TPU", [](auto& o) { o.tpu = "v9-8"; }, "--tpu 'v9-8': unknown TPU type (known: v4-8, v4-16,"},
      {"TPU and GPUs",
       [](auto& o) {
         o.tpu = "v6e-8";
         o.gpus_per_host = 1;
         o.hosts = 0;
       },
       "--tpu v6e-8 and --gpus-per-host 1 exclude each other"},
      {"hosts against the slice", [](auto& o) { o.tpu = "v5p-16"; },
       "--hosts 3 disagrees with --tpu v5p-16, a slice of 2"},
      {"negative GPUs", [](auto& o) { o.gpus_per_host = -1; }, "--gpus-per-host -1: expected 0 or more"},
      {"ranks against GPUs",
       [](auto& o) {
         o.gpus_per_host = 4;
         o.nproc_per_host = 2;
       },
       "--nproc-per-host 2 disagrees with --gpus-per-host 4"},
      {"negative ranks", [](auto& o) { o.nproc_per_host = -1; }, "--nproc-per-host -1"},
      {"port 0", [](auto& o) { o.port = 0; }, "--port 0: expected a TCP port, 1..65535"},
      {"port too big", [](auto& o) { o.port = 70000; }, "--port 70000"},
      {"restarts", [](auto& o) { o.max_restarts = -1; }, "--max-restarts -1: expected 0 or more"},
      {"launch restarts", [](auto& o) { o.launch_max_restarts = -3; }, "--launch-max-restarts -3"},
      {"grace", [](auto& o) { o.termination_grace_s = -1; }, "--termination-grace -1"},
      {"claim", [](auto& o) { o.checkpoint_claim = "My_Claim"; }, "--checkpoint-claim 'My_Claim'"},
      {"relative mount", [](auto& o) { o.checkpoint_dir = "ckpt"; }, "--checkpoint-dir 'ckpt': expected an absolute"},
      {"cpu", [](auto& o) { o.cpu = "lots"; }, "--cpu 'lots': expected a Kubernetes quantity"},
      {"memory", [](auto& o) { o.memory = "64GB"; }, "--memory '64GB': expected a Kubernetes quantity"},
      {"no command", [](auto& o) { o.command.clear(); }, "no command: usage: tessera k8s render"},
      {"bad UTF-8", [](auto& o) { o.command.push_back("\xff"); }, "command argument 5 is not valid UTF-8"},
      {"bad UTF-8 run dir", [](auto& o) { o.run_dir = "/x/\xc3"; }, "--run-dir: not valid UTF-8"},
  };
  for (const BadCase& c : cases) {
    K8sRenderOptions o = cpu_job();
    c.change(o);
    try {
      render_k8s_manifests(o, ManifestFormat::kYaml);
      ADD_FAILURE() << c.what << ": rendered without an error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << c.what << ": expected '" << c.message << "' in: " << e.what();
    }
  }
}

TEST(K8sManifest, QuantitiesAndNamesThatAreFine) {
  K8sRenderOptions o = cpu_job();
  for (const char* q : {"8", "500m", "1.5", "64Gi", "1e3", "2E"}) {
    o.cpu = q;
    EXPECT_NO_THROW(validate_k8s_options(o)) << q;
  }
  o.name = std::string(61, 'a');  // NAME-2 is 63 characters
  EXPECT_NO_THROW(validate_k8s_options(o));
  o.checkpoint_claim = "ckpt.rwx-1";
  EXPECT_NO_THROW(validate_k8s_options(o));
}

}  // namespace
}  // namespace tessera::launch
