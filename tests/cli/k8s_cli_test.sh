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
#   errors        bad input exits 2 with a message naming the option;
#   pods_on_test_hosts
#                 the pods of a rendered 2-host Job run for real: each pod's env and argv
#                 (as above) run on its own test host (tools/testbed.sh; pod 0's DNS name
#                 resolves to the first host, as the headless Service's record would), a
#                 `--mesh data=2` training that equals the same mesh in one process bit for
#                 bit. Skips without root and network namespaces.
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
import sys
sys.path.insert(0, "tests/cli")
from k8s_pods import expand, pod_argv, pods
tessera = sys.argv[1]

def check(args, nnodes, nproc, port, command, extra=()):
    host0, spec = pods(tessera, args)
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nnodes, spec
    for i in range(nnodes):
        argv = pod_argv(spec, i)[1]
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
pods_on_test_hosts)
  testbed="$src/tools/testbed.sh"
  reason="$("$testbed" check 2>&1)" || skip "no test hosts here: $reason"
  trap '"$testbed" down; rm -rf "$tmp"' EXIT
  "$testbed" up 2
  tiny_train_args 8 --quiet --mesh data=2
  TESSERA_CPU_DEVICES=2 "$tessera" "${train_args[@]}" --set run.dir="$tmp/one" >"$tmp/one.txt" 2>&1 ||
    fail "the one-process run: $(tail -5 "$tmp/one.txt")"
  first_host="$(awk '$2 == "tbh1" { print $1 }' /etc/netns/tbh1/hosts)"
  for host in tbh1 tbh2; do echo "$first_host tiny-0.tiny" >>"/etc/netns/$host/hosts"; done
  python3 - "$tessera" "$testbed" "$tmp" "${train_args[@]}" --set run.dir="$tmp/k8s" <<'PY' ||
import subprocess, sys
sys.path.insert(0, "tests/cli")
from k8s_pods import pod_argv, pods
tessera, testbed, tmp, *command = sys.argv[1:]
host0, spec = pods(tessera, ["--name", "tiny", "--hosts", "2", "--image", "example/tessera:1", "--tessera-bin",
                             tessera, "--launch-max-restarts", "0", "--", tessera, *command])
assert host0 == "tiny-0.tiny", host0
running = []
for i in range(2):
    env, argv = pod_argv(spec, i)
    log = open(f"{tmp}/pod{i}.txt", "w")
    running.append(subprocess.Popen([testbed, "exec", f"tbh{i + 1}", "env", *[f"{k}={v}" for k, v in env.items()],
                                     *argv], stdout=log, stderr=subprocess.STDOUT))
codes = [p.wait(timeout=300) for p in running]
if codes != [0, 0]:
    sys.exit(f"pods exited {codes}")
PY
    fail "the pods: $(tail -5 "$tmp/pod0.txt"); $(tail -5 "$tmp/pod1.txt")"
  grep -q "mesh (data=2) (tcp (rank 0 of 2))" "$tmp/pod0.txt" || fail "pod 0 did not train as rank 0 of a TCP job"
  grep -q "coordinator tiny-0.tiny:29500" "$tmp/pod1.txt" || fail "pod 1 did not meet at tiny-0.tiny: $(cat "$tmp/pod1.txt")"
  diff <(grep -o '"loss":[^,]*' "$tmp/one/metrics.jsonl") <(grep -o '"loss":[^,]*' "$tmp/k8s/metrics.jsonl") ||
    fail "the losses differ from the one-process run's"
  for f in params.safetensors opt_state.safetensors; do
    cmp -s "$tmp/one/checkpoints/step_00000008/$f" "$tmp/k8s/checkpoints/step_00000008/$f" ||
      fail "$f differs from the one-process run's"
  done
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
