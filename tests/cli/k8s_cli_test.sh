#!/usr/bin/env bash
# `tessera k8s render` end to end:
#   golden        each case of tests/oracles/goldens/k8s_manifests.json (the manifests the
#                 oracle validated against the Kubernetes schemas) renders byte-identical
#                 today, to stdout and with --out;
#   pod_commands  for each pod index, the environment and argv Kubernetes would give the
#                 container (downward-API completion index, $(VAR) expansion as Kubernetes
#                 does it) are `tessera launch --nnodes N --node-rank I --coordinator
#                 HOST:PORT --nproc-per-host P ... -- COMMAND` with HOST the DNS name pod 0
#                 gets (Indexed Job + headless Service, or JobSet), COMMAND verbatim;
#   errors        bad input exits 2 with a message naming the option.
# Only python3's standard library: the JSON form (--format json) is parsed, not the YAML.
source "$(dirname "$0")/cli_common.sh" "$@"

case "$case_name" in
golden)
  python3 - "$tessera" tests/oracles/goldens/k8s_manifests.json "$tmp" <<'PY' || fail "rendered manifests differ from the validated golden"
import json, os, subprocess, sys
tessera, golden, tmp = sys.argv[1:]
cases = json.load(open(golden, encoding="utf-8"))["cases"]
assert len(cases) >= 5, cases
bad = []
for case in cases:
    out = subprocess.run([tessera, "k8s", "render"] + case["args"], capture_output=True, check=True).stdout
    if out.decode("utf-8") != case["manifest"]:
        bad.append(case["name"])
    path = os.path.join(tmp, case["name"] + ".yaml")
    subprocess.run([tessera, "k8s", "render", "--out", path] + case["args"], capture_output=True, check=True)
    if open(path, "rb").read() != out:
        bad.append(case["name"] + " (--out)")
if bad:
    print(f"differ from the golden: {bad}; if the change is meant, rerun tests/oracles/run_oracle.sh k8s_manifests "
          "--update (it validates them again) and commit the golden", file=sys.stderr)
    sys.exit(1)
print(f"{len(cases)} cases byte-identical to the validated golden")
PY
  ;;
pod_commands)
  python3 - "$tessera" <<'PY' || fail "a pod's command is not what tessera launch expects"
import json, subprocess, sys
tessera = sys.argv[1]
INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

def expand(s, env):
    """Kubernetes' $(VAR) expansion of command and args (third_party/forked/golang/expansion):
    $$ -> $, $(NAME) -> its value when NAME is in the container's env, else left as is."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt == "$":
                out.append("$"); i += 2; continue
            if nxt == "(":
                close = s.find(")", i + 2)
                if close != -1:
                    name = s[i + 2:close]
                    out.append(env[name] if name in env else "$(" + name + ")")
                    i = close + 1; continue
                out.append("$("); i += 2; continue
            out.append("$" + nxt); i += 2; continue
        out.append(s[i]); i += 1
    return "".join(out)

assert expand("a$$b$(X)$(Y)$$(X)$(", {"X": "1"}) == "a$b1$(Y)$(X)$(", "expansion"

def pods(args):
    """(hostname of pod 0 with its subdomain, job spec, port) as Kubernetes would name them."""
    docs = json.loads(subprocess.run([tessera, "k8s", "render", "--format", "json"] + args,
                                     capture_output=True, check=True).stdout)["items"]
    kinds = [d["kind"] for d in docs]
    if kinds == ["JobSet"]:
        js = docs[0]
        assert js["spec"]["network"]["enableDNSHostnames"] is True
        rjob = js["spec"]["replicatedJobs"][0]
        assert rjob["replicas"] == 1
        subdomain = js["spec"]["network"].get("subdomain", js["metadata"]["name"])
        # JobSet pod hostnames: <jobset>-<replicatedJob>-<jobIndex>-<podIndex>
        host0 = f"{js['metadata']['name']}-{rjob['name']}-0-0.{subdomain}"
        return host0, rjob["template"]["spec"]
    assert kinds == ["Service", "Job"], kinds
    service, job = docs
    spec = job["spec"]
    pod = spec["template"]["spec"]
    # A headless Service selecting the Job's pods (the Job controller labels them with
    # batch.kubernetes.io/job-name) named as the pods' subdomain: pod I is <job>-<I>.<subdomain>.
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert pod["subdomain"] == service["metadata"]["name"]
    return f"{job['metadata']['name']}-0.{pod['subdomain']}", spec

def check(args, nnodes, nproc, port, command, extra=()):
    host0, spec = pods(args)
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nnodes, spec
    container = spec["template"]["spec"]["containers"][0]
    for i in range(nnodes):
        env = {}
        for var in container.get("env", []):
            if var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == INDEX:
                env[var["name"]] = str(i)  # the Job controller's annotation on pod I
            elif "value" in var:
                env[var["name"]] = expand(var["value"], env)
        argv = [expand(a, env) for a in container["command"] + container.get("args", [])]
        want = ["tessera", "launch", "--nnodes", str(nnodes), "--node-rank", str(i), "--coordinator",
                f"{host0}:{port}", "--nproc-per-host", str(nproc), *extra, "--", *command]
        assert argv == want, f"pod {i} of {args}:\n  {argv}\n  expected\n  {want}"
    print(f"ok: {len(args)} args, {nnodes} pods, coordinator {host0}:{port}")

train = ["tessera", "train", "--config", "configs/tiny.toml", "--set", "run.dir=/checkpoints/tiny"]
image = ["--image", "example/tessera:1"]
check(["--name", "tiny", "--hosts", "3", *image, "--", *train], 3, 1, 29500, train)
check(["--name", "gpu", "--hosts", "2", "--gpus-per-host", "8", "--port", "4000", *image, "--launch-max-restarts",
       "4", "--run-dir", "/checkpoints/gpu", "--", *train], 2, 8, 4000, train,
      ["--max-restarts", "4", "--run-dir", "/checkpoints/gpu"])
check(["--name", "tpu", "--tpu", "v5litepod-16", *image, "--", *train], 4, 1, 29500, train)
check(["--jobset", "--name", "set", "--hosts", "4", "--nproc-per-host", "2", *image, "--", *train], 4, 2, 29500, train)
awkward = ["sh", "-c", 'echo "a: b" # x\nexec tessera "$@"', "$(JOB_COMPLETION_INDEX)", "$$", "$(HOME)", "-x",
           "yes", "", "caf\u00e9", "back\\slash", "[a,b]", "--", "--hosts"]
check(["--name", "awk", "--hosts", "2", *image, "--run-dir", "/ck/$(USER)", "--", *awkward], 2, 1, 29500, awkward,
      ["--run-dir", "/ck/$(USER)"])
check(["--jobset", "--name", "awk", "--hosts", "2", *image, "--", *awkward], 2, 1, 29500, awkward)
PY
  ;;
errors)
  expect_error() {
    local want="$1"
    shift
    local status=0
    out="$("$tessera" k8s render "$@" 2>&1)" || status=$?
    [[ $status -eq 2 ]] || fail "tessera k8s render $*: exit $status, expected 2: $out"
    grep -qF -- "$want" <<<"$out" || fail "tessera k8s render $*: expected '$want' in: $out"
  }
  cmd=(-- tessera train --config configs/tiny.toml)
  img=(--image example/tessera:1)
  expect_error "tessera k8s render: --hosts 0: expected the number of pods, one per host (>= 1)" "${img[@]}" \
    --hosts 0 "${cmd[@]}"
  expect_error "tessera k8s render: --hosts 0" "${img[@]}" "${cmd[@]}"
  expect_error "--hosts" "${img[@]}" --hosts two "${cmd[@]}"
  expect_error "tessera k8s render: --image is required" --hosts 2 "${cmd[@]}"
  expect_error "--name 'Big_Job': expected a DNS-1035 label" --name Big_Job "${img[@]}" --hosts 2 "${cmd[@]}"
  expect_error "--namespace 'ML'" --namespace ML "${img[@]}" --hosts 2 "${cmd[@]}"
  expect_error "--tpu 'v9-8': unknown TPU type (known: v4-8," --tpu v9-8 "${img[@]}" "${cmd[@]}"
  expect_error "--hosts 3 disagrees with --tpu v5p-16" --tpu v5p-16 --hosts 3 "${img[@]}" "${cmd[@]}"
  expect_error "--tpu v5p-8 and --gpus-per-host 2 exclude each other" --tpu v5p-8 --gpus-per-host 2 "${img[@]}" \
    "${cmd[@]}"
  expect_error "--nproc-per-host 2 disagrees with --gpus-per-host 8" --hosts 2 --gpus-per-host 8 \
    --nproc-per-host 2 "${img[@]}" "${cmd[@]}"
  expect_error "--port 0: expected a TCP port" --port 0 --hosts 2 "${img[@]}" "${cmd[@]}"
  expect_error "--max-restarts -1" --max-restarts -1 --hosts 2 "${img[@]}" "${cmd[@]}"
  expect_error "--checkpoint-claim 'Ckpt'" --checkpoint-claim Ckpt --hosts 2 "${img[@]}" "${cmd[@]}"
  expect_error "--checkpoint-dir 'ckpt': expected an absolute path" --checkpoint-dir ckpt --hosts 2 "${img[@]}" \
    "${cmd[@]}"
  expect_error "--memory '64GB': expected a Kubernetes quantity" --memory 64GB --hosts 2 "${img[@]}" "${cmd[@]}"
  expect_error "--format" --format xml --hosts 2 "${img[@]}" "${cmd[@]}"
  expect_error "tessera k8s render: no command" --hosts 2 "${img[@]}"
  expect_error "command argument 2 is not valid UTF-8" --hosts 2 "${img[@]}" -- tessera $'\xff'
  # A good render warns about the per-pod emptyDir on stderr, not in the manifests on stdout.
  "$tessera" k8s render --hosts 2 "${img[@]}" "${cmd[@]}" 2>"$tmp/err" >"$tmp/out" || fail "good render failed"
  grep -q "^warning: no --checkpoint-claim" "$tmp/err" || fail "no emptyDir warning: $(cat "$tmp/err")"
  grep -q "^warning" "$tmp/out" && fail "a warning in the manifests"
  "$tessera" k8s render --out /nonexistent/dir/x.yaml --hosts 2 "${img[@]}" "${cmd[@]}" 2>"$tmp/err" &&
    fail "writing to a missing directory succeeded"
  grep -q "cannot write /nonexistent/dir/x.yaml" "$tmp/err" || fail "no clear write error: $(cat "$tmp/err")"
  ;;
*) fail "unknown case" ;;
esac
