#!/usr/bin/env python3
"""Kubernetes schema oracle for `tessera k8s render`.

Writes tests/oracles/goldens/k8s_manifests.json. For each case below the built binary
($TESSERA_BIN, default build/bin/tessera) renders the manifests twice, as YAML (the
text stored in the golden, which tests/cli/k8s_cli_test.sh case `golden` compares
byte for byte with what the binary renders today) and as JSON (--format json), and:

  1. the YAML documents, read by PyYAML, equal the JSON form (the emitter's quoting);
  2. every Kubernetes object (Service, batch/v1 Job) validates with kubernetes-validate
     against the Kubernetes 1.31 and 1.37 schemas in strict mode (unknown fields fail);
  3. a JobSet (a CRD kubernetes-validate does not know): its Job template, wrapped as a
     batch/v1 Job named like JobSet's child Job, validates as in 2; its own fields are
     checked against JOBSET_SCHEMA below, a transcription of the JobSet v0.10.1 CRD
     (config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml) for the fields tessera
     writes, unknown fields refused, plus what JobSet's admission webhook checks
     (rule names, failure reasons, pod name length);
  4. checks of server-side rules the schemas cannot express (restartPolicy Never with a
     podFailurePolicy, completions == parallelism == hosts, Indexed, the exit-code
     rules naming the container, the JobSet message patterns matching the Job
     controller's message for the intended rule and no other).

A few mutated manifests must be refused (an unknown field, a wrong type, an unknown
JobSet action), so the strictness is itself checked. Any failure exits 1.

Run through tests/oracles/run_oracle.sh k8s_manifests (pinned venv, live diff).
Usage: k8s_manifests.py OUT.json
"""
import copy
import json
import os
import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

GENERATOR = "tests/oracles/k8s_manifests.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBERNETES_VERSIONS = ["1.31", "1.37"]
IMAGE = "registry.example/tessera:2026.11"

# Each case: name and the arguments after `tessera k8s render`.
CASES = [
    ("cpu_job", ["--name", "tiny", "--image", IMAGE, "--hosts", "2", "--", "tessera", "train", "--config",
                 "configs/tiny.toml", "--set", "run.dir=/checkpoints/tiny"]),
    ("gpu_job", ["--name", "gpt2", "--namespace", "ml", "--image", IMAGE, "--hosts", "4", "--gpus-per-host", "8",
                 "--cpu", "200", "--memory", "1800Gi", "--checkpoint-claim", "ckpt-rwx", "--run-dir",
                 "/checkpoints/gpt2", "--max-restarts", "2", "--launch-max-restarts", "5", "--", "tessera", "train",
                 "--config", "configs/gpt2_124m.toml", "--set", "run.dir=/checkpoints/gpt2"]),
    ("tpu_job", ["--name", "tpu-train", "--image", IMAGE, "--tpu", "v5p-16", "--checkpoint-claim", "ckpt-rwx",
                 "--", "tessera", "train", "--config", "configs/tiny.toml", "--set", "run.dir=/checkpoints/tpu"]),
    ("jobset", ["--jobset", "--name", "fortunes", "--namespace", "ml", "--image", IMAGE, "--hosts", "3",
                "--nproc-per-host", "2", "--checkpoint-claim", "ckpt-rwx", "--port", "23456", "--", "tessera",
                "train", "--config", "configs/fortunes.toml", "--set", "run.dir=/checkpoints/fortunes"]),
    ("jobset_tpu", ["--jobset", "--name", "tpu-set", "--image", IMAGE, "--tpu", "v6e-16", "--checkpoint-claim",
                    "ckpt-rwx", "--max-restarts", "5", "--", "tessera", "train", "--config", "configs/tiny.toml"]),
    ("awkward_command", ["--name", "awkward", "--image", IMAGE, "--hosts", "2", "--run-dir", "/checkpoints/$USER",
                         "--", "sh", "-c", 'echo "a: b" # not a comment\nexec tessera train "$@"', "key: value",
                         "-leading", "$(HOME)", "$$", "yes", "2", "null", "~", "tab\there", "caf\u00e9",
                         "back\\slash", "'single'", "[list]", "[a,b]", "--", "{map}", "&anchor", "*alias", "!tag", "%",
                         "@", "`", "|", ">", "", " padded ", "ctl\x01\x1b\x7f\u0085\u2028\ufeff"]),
]

INT32 = {"type": "integer", "minimum": -2147483648, "maximum": 2147483647}
STRINGS = {"type": "array", "items": {"type": "string"}}
JOB_FAILURE_REASONS = ["BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                       "PodFailurePolicy"]  # JobSet v0.10.1 webhook: validOnJobFailureReasons


def closed(properties, required=()):
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(required)}


# JobSet v1alpha2 as its v0.10.1 CRD declares it (the fields of JobSetSpec; the Job
# template is validated separately as a batch/v1 Job, metadata as the Job's).
JOBSET_SCHEMA = closed({
    "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
    "kind": {"const": "JobSet"},
    "metadata": {"type": "object"},
    "spec": closed({
        "coordinator": closed({"replicatedJob": {"type": "string"}, "jobIndex": {"type": "integer"},
                               "podIndex": {"type": "integer"}}, ["replicatedJob"]),
        "failurePolicy": closed({
            "maxRestarts": INT32,
            "restartStrategy": {"enum": ["Recreate", "BlockingRecreate"]},
            "rules": {"type": "array", "items": closed({
                "name": {"type": "string", "minLength": 1, "maxLength": 128,
                         "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "action": {"enum": ["FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"]},
                "onJobFailureReasons": {"type": "array", "items": {"enum": JOB_FAILURE_REASONS}},
                "onJobFailureMessagePatterns": STRINGS,
                "targetReplicatedJobs": STRINGS,
            }, ["action", "name"])},
        }),
        "managedBy": {"type": "string"},
        "network": closed({"enableDNSHostnames": {"type": "boolean"}, "publishNotReadyAddresses": {"type": "boolean"},
                           "subdomain": {"type": "string"}}),
        "replicatedJobs": {"type": "array", "minItems": 1, "items": closed({
            "dependsOn": {"type": "array"},
            "groupName": {"type": "string"},
            "name": {"type": "string"},
            "replicas": INT32,
            "template": closed({"metadata": {"type": "object"}, "spec": {"type": "object"}}),
        }, ["name", "template"])},
        "startupPolicy": {"type": "object"},
        "successPolicy": closed({"operator": {"enum": ["All", "Any"]}, "targetReplicatedJobs": STRINGS}, ["operator"]),
        "suspend": {"type": "boolean"},
        "ttlSecondsAfterFinished": INT32,
    }, ["replicatedJobs"]),
}, ["apiVersion", "kind", "spec"])

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def render(args, fmt):
    binary = os.environ.get("TESSERA_BIN", os.path.join(ROOT, "build/bin/tessera"))
    out = subprocess.run([binary, "k8s", "render", "--format", fmt] + args, check=True, capture_output=True)
    return out.stdout.decode("utf-8")


def validate_k8s(obj, problems, where):
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: Kubernetes {version}: {e.message} at {list(e.path)}")


def controller_message(rule, index, action):
    """The Job controller's condition message for a pod failure matching `rule` (its
    pod_failure_policy.go: "Container C for pod NS/P failed with exit code X matching
    ACTION rule at index I", or "Pod NS/P has condition T matching ACTION rule at index I")."""
    if "onExitCodes" in rule:
        code = rule["onExitCodes"]["values"][0]
        return f"Container tessera for pod ml/x-workers-0-0-abcde failed with exit code {code} " \
               f"matching {action} rule at index {index}"
    return f"Pod ml/x-workers-0-0-abcde has condition DisruptionTarget matching {action} rule at index {index}"


def check_job_spec(spec, hosts, problems, where):
    pod = spec["template"]["spec"]
    if spec.get("completionMode") != "Indexed":
        problems.append(f"{where}: completionMode is not Indexed")
    if not spec.get("completions") == spec.get("parallelism") == hosts:
        problems.append(f"{where}: completions {spec.get('completions')} / parallelism {spec.get('parallelism')} "
                        f"are not the {hosts} hosts")
    if "podFailurePolicy" in spec and pod.get("restartPolicy") != "Never":
        problems.append(f"{where}: a podFailurePolicy needs restartPolicy Never")
    containers = {c["name"] for c in pod["containers"]}
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes")
        if codes and (codes.get("containerName") not in containers or (codes["operator"] == "In" and 0 in codes["values"])):
            problems.append(f"{where}: bad onExitCodes {codes}")


def check_jobset(obj, hosts, problems):
    try:
        jsonschema.Draft202012Validator(JOBSET_SCHEMA).validate(obj)
    except jsonschema.ValidationError as e:
        problems.append(f"JobSet: v0.10.1 CRD fields: {e.message} at {list(e.path)}")
        return
    name = obj["metadata"]["name"]
    rules = obj["spec"]["failurePolicy"]["rules"]
    if len({r["name"] for r in rules}) != len(rules):
        problems.append("JobSet: rule names are not unique")
    for rjob in obj["spec"]["replicatedJobs"]:
        longest_pod = f"{name}-{rjob['name']}-{rjob.get('replicas', 1) - 1}-{hosts - 1}-abcde"
        if not DNS1035.match(longest_pod) or len(longest_pod) > 63:
            problems.append(f"JobSet: pod name {longest_pod} is not a DNS-1035 label of at most 63 characters")
        spec = rjob["template"]["spec"]
        wrapped = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-{rjob['name']}-0"},
                   "spec": spec}
        validate_k8s(wrapped, problems, f"JobSet {rjob['name']} template as a batch/v1 Job")
        check_job_spec(spec, hosts, problems, f"JobSet {rjob['name']}")
        # Each FailJob pod rule's message must be matched by exactly the JobSet rule meant for it.
        pod_rules = spec["podFailurePolicy"]["rules"]
        for index, pod_rule in enumerate(pod_rules):
            if pod_rule["action"] != "FailJob":
                continue
            message = controller_message(pod_rule, index, "FailJob")
            matched = [r["name"] for r in rules if "PodFailurePolicy" in r.get("onJobFailureReasons", [])
                       and all(re.search(p, message) for p in r.get("onJobFailureMessagePatterns", []))]
            want = "UsageError" if "onExitCodes" in pod_rule else "Disruption"
            if matched[:1] != [want]:
                problems.append(f"JobSet: pod rule {index} ({message!r}) is matched by {matched}, expected {want}")


def evaluate(name, args):
    text = render(args, "yaml")
    listed = json.loads(render(args, "json"))
    docs = listed["items"]
    problems = []
    if list(yaml.safe_load_all(text)) != docs:
        problems.append("the YAML documents differ from the JSON form")
    # The pods' command ends with the arguments after `--`, verbatim but for `$` -> `$$`.
    command = [a.replace("$", "$$") for a in args[args.index("--") + 1:]]
    for obj in docs:
        spec = obj["spec"]["replicatedJobs"][0]["template"]["spec"] if obj["kind"] == "JobSet" else obj["spec"]
        if obj["kind"] in ("Job", "JobSet"):
            rendered = spec["template"]["spec"]["containers"][0]["command"]
            if rendered[len(rendered) - len(command):] != command or rendered[-len(command) - 1] != "--":
                problems.append(f"{obj['kind']}: the command is not passed verbatim: {rendered}")
    hosts = None
    for obj in docs:
        kind = obj["kind"]
        if kind == "Job":
            hosts = obj["spec"]["completions"]
    verdicts = []
    for obj in docs:
        kind = obj["kind"]
        if kind == "JobSet":
            hosts = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"]
            check_jobset(obj, hosts, problems)
            verdicts.append("JobSet: fields valid against the JobSet v0.10.1 CRD (transcribed); its Job template "
                            f"valid as batch/v1 Job in Kubernetes {', '.join(KUBERNETES_VERSIONS)} (strict)")
        else:
            validate_k8s(obj, problems, kind)
            if kind == "Job":
                check_job_spec(obj["spec"], hosts, problems, "Job")
            verdicts.append(f"{obj['apiVersion']} {kind}: valid in Kubernetes {', '.join(KUBERNETES_VERSIONS)} "
                            "(strict)")
    if problems:
        for p in problems:
            print(f"FAIL {name}: {p}", file=sys.stderr)
        return None
    return {"name": name, "args": args, "manifest": text, "verdicts": verdicts}


def strictness_checks(cases):
    """Mutations the validators must refuse: proof that strict mode is on."""
    by_name = {c["name"]: json.loads(render(c["args"], "json"))["items"] for c in cases}
    results = []

    def refused_k8s(label, obj):
        problems = []
        validate_k8s(obj, problems, label)
        results.append({"name": label, "refused": len(problems) == len(KUBERNETES_VERSIONS)})

    job = copy.deepcopy(by_name["cpu_job"][1])
    job["spec"]["podFailurePolicy"]["rules"][0]["onExitCode"] = job["spec"]["podFailurePolicy"]["rules"][0].pop(
        "onExitCodes")
    refused_k8s("job_misspelled_onExitCodes", job)
    job = copy.deepcopy(by_name["cpu_job"][1])
    job["spec"]["completions"] = "2"
    refused_k8s("job_completions_as_string", job)
    service = copy.deepcopy(by_name["cpu_job"][0])
    service["spec"]["headless"] = True
    refused_k8s("service_unknown_field", service)
    for label, change in [("jobset_unknown_action", lambda s: s["failurePolicy"]["rules"][0].update(action="Retry")),
                          ("jobset_unknown_field", lambda s: s["network"].update(hostnames=True)),
                          ("jobset_bad_rule_name", lambda s: s["failurePolicy"]["rules"][0].update(name="usage-error"))]:
        obj = copy.deepcopy(by_name["jobset"][0])
        change(obj["spec"])
        problems = []
        check_jobset(obj, 3, problems)
        results.append({"name": label, "refused": bool(problems)})
    return results


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    from importlib.metadata import version
    cases = [evaluate(name, args) for name, args in CASES]
    if any(c is None for c in cases):
        sys.exit(1)
    strict = strictness_checks(cases)
    if not all(s["refused"] for s in strict):
        print(f"FAIL: a mutated manifest was accepted: {[s for s in strict if not s['refused']]}", file=sys.stderr)
        sys.exit(1)
    out = {"generator": GENERATOR,
           "reference": f"kubernetes-validate {version('kubernetes-validate')} (Kubernetes "
                        f"{', '.join(KUBERNETES_VERSIONS)}, strict); JobSet v0.10.1 CRD fields (transcribed)",
           "versions": {p: version(p) for p in ["kubernetes-validate", "jsonschema", "PyYAML"]},
           "cases": cases, "strictness_checks": strict}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    print(f"[oracle] {len(cases)} cases valid; {len(strict)} mutated manifests refused")


if __name__ == "__main__":
    main()
