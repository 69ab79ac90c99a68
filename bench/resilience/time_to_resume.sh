#!/usr/bin/env bash
# Time to resume: from the death of a supervised worker to its first completed step after
# the restart, split into its parts, for three set-ups (medians of REPEATS runs each):
#
#   cold   no compilation cache, checkpoints only in the persistent tier (RUN_DIR)
#   cache  + the persistent compilation cache (run.compilation_cache = auto)
#   local  + a local checkpoint tier in /dev/shm every LOCAL_INTERVAL steps
#
#   bench/resilience/time_to_resume.sh [OUT_DIR] [TESSERA]      (from the repository root)
#   PRESET=small KILL_STEP=17 INTERVAL=10 LOCAL_INTERVAL=2 REPEATS=3 CONFIGS="cold cache local"
#
# Each run is `tessera launch --max-restarts 1` over `tessera train --config configs/small.toml`
# with TESSERA_FAULT=kill@step=KILL_STEP (SIGKILL once KILL_STEP steps are done). Every time
# comes from the goodput log (RUN_DIR/goodput/events.jsonl), no new instrumentation:
#   death       the killed attempt's last step_end (the kill fires at the next step's start,
#               after only the heartbeat and metrics bookkeeping)
#   detect      death -> the supervisor's `failure` event (it polls every 0.2 s)
#   restart     failure -> the next `attempt_start` (stopping the group; a --backoff wait only in crash loops)
#   exec+cfg    attempt_start (just before fork/exec) -> the trainer's first event
#               (backend_init_start: process loaded, config parsed, run dir checked, log opened)
#   init        backend_init (of which `calib`: the CPU calibration GEMM), data files, model
#   restore     checkpoint_restore (list tiers, verify checksums, read the newest valid one)
#   compile     compile_start -> compile_end, with its cache_hit
#   step1       the first step_start -> step_end (the batch wait before it falls in `other`)
#   total       death -> the first step_end after the restart; `other` is what the parts miss
#   regained    death -> the restarted run's step_end of KILL_STEP (lost steps redone)
# Prints a table of medians, then one JSON line. PARSE_ONLY=1 reads the runs already in OUT_DIR.
set -euo pipefail

out="${1:-/tmp/time-to-resume}"
tessera="${2:-build/bin/tessera}"
preset="${PRESET:-small}"
kill_step="${KILL_STEP:-17}"
interval="${INTERVAL:-10}"
local_interval="${LOCAL_INTERVAL:-2}"
repeats="${REPEATS:-3}"
configs="${CONFIGS:-cold cache local}"
unset TESSERA_COMPILATION_CACHE_DIR TESSERA_FAULT
mkdir -p "$out"

run_one() {  # run_one CONFIG INDEX -> RUN_DIR of a finished run
  local config="$1" i="$2"
  local run_dir="$out/$config-$i" local_dir="/dev/shm/tessera-ttr-$config-$i"
  rm -rf "$run_dir" "$local_dir"
  local sets=(--set run.dir="$run_dir" --set model.preset="$preset" --set train.steps=$((kill_step + 2))
    --set schedule.warmup_steps=5 --set train.eval_interval=0 --set train.eval_batches=1
    --set checkpoint.interval="$interval")
  case "$config" in
    # cold and cache: no local tier (it is on by default since the local-tier change).
    cold) sets+=(--set run.compilation_cache= --set 'checkpoint.local_dir=""') ;;
    cache) sets+=(--set run.compilation_cache=auto --set 'checkpoint.local_dir=""') ;;
    local) sets+=(--set run.compilation_cache=auto --set checkpoint.local_dir="$local_dir"
      --set checkpoint.local_interval="$local_interval") ;;
    *) echo "time_to_resume: unknown config '$config' (expected cold, cache or local)" >&2 && exit 2 ;;
  esac
  TESSERA_FAULT="kill@step=$kill_step" "$tessera" launch --max-restarts 1 --run-dir "$run_dir" -- \
    "$tessera" train --config configs/small.toml --quiet "${sets[@]}" >"$run_dir.launch.txt" 2>&1 || {
    echo "time_to_resume: $config run $i failed; see $run_dir.launch.txt" >&2
    tail -5 "$run_dir.launch.txt" >&2
    exit 1
  }
  rm -rf "$local_dir"
  echo "$run_dir"
}

runs=()
for config in $configs; do
  for ((i = 1; i <= repeats; ++i)); do
    if [[ "${PARSE_ONLY:-0}" == 1 ]]; then
      runs+=("$config=$out/$config-$i")
      continue
    fi
    echo "[time_to_resume] $config run $i/$repeats (preset $preset, kill at step $kill_step)" >&2
    run_dir="$(run_one "$config" "$i")"
    runs+=("$config=$run_dir")
  done
done

python3 - "$kill_step" "$preset" "$(uptime | sed 's/.*load average: //')" "${runs[@]}" <<'EOF'
import json, statistics, sys

kill_step, preset, load = int(sys.argv[1]), sys.argv[2], sys.argv[3]

def parts(run_dir):
    events = [json.loads(l) for l in open(f"{run_dir}/goodput/events.jsonl") if l.strip()]
    def first(kind, attempt, pred=lambda e: True):
        return next(e for e in events if e["type"] == kind and e.get("attempt") == attempt and pred(e))
    death = max(e["t"] for e in events if e["type"] == "step_end" and e.get("attempt") == 0)
    failure = first("failure", 0)
    # A restart after progress is immediate (no launch_wait); only crash loops back off.
    wait = next((e for e in events if e["type"] == "launch_wait"), {"start": 0.0, "end": 0.0})
    start = first("attempt_start", 1)
    init0, init1 = first("backend_init_start", 1), first("backend_init_end", 1)
    calib = first("calibration", 1)
    r0, r1 = first("checkpoint_restore_start", 1), first("checkpoint_restore_end", 1)
    c0, c1 = first("compile_start", 1), first("compile_end", 1)
    step1_start, step1 = first("step_start", 1), first("step_end", 1)
    regained = first("step_end", 1, lambda e: e["step"] == kill_step)
    p = {
        "detect_s": failure["t"] - death,
        "restart_s": start["t"] - failure["t"],
        "backoff_s": wait["end"] - wait["start"],
        "exec_config_s": init0["t"] - start["t"],
        "init_s": init1["t"] - init0["t"],
        "calib_s": calib["t"] - init0["t"],
        "restore_s": r1["t"] - r0["t"],
        "compile_s": c1["t"] - c0["t"],
        "first_step_s": step1["t"] - step1_start["t"],
        "total_s": step1["t"] - death,
        "regained_s": regained["t"] - death,
        "resumed_from": step1["step"] - 1,
        "cache_hit": bool(c1.get("cache_hit", False)),
    }
    named = ["detect_s", "restart_s", "exec_config_s", "init_s", "restore_s", "compile_s", "first_step_s"]
    p["other_s"] = p["total_s"] - sum(p[k] for k in named)
    return p

by_config = {}
for item in sys.argv[4:]:
    config, run_dir = item.split("=", 1)
    by_config.setdefault(config, []).append(parts(run_dir))

cols = [("detect", "detect_s"), ("restart", "restart_s"), ("(backoff)", "backoff_s"), ("exec+cfg", "exec_config_s"),
        ("init", "init_s"), ("(calib)", "calib_s"), ("restore", "restore_s"), ("compile", "compile_s"),
        ("step1", "first_step_s"), ("other", "other_s"), ("TOTAL", "total_s"), ("regained", "regained_s")]
print(f"time to resume, preset {preset}, SIGKILL after step {kill_step}; medians in seconds "
      f"(n = {len(next(iter(by_config.values())))}); load average at the end {load}")
print(f"{'config':<7}" + "".join(f"{c:>10}" for c, _ in cols) + f"{'cache hit':>10}{'resumed':>8}")
results = []
for config, runs in by_config.items():
    med = {k: statistics.median(r[k] for r in runs) for _, k in cols}
    hits = sum(r["cache_hit"] for r in runs)
    resumed = statistics.median(r["resumed_from"] for r in runs)
    print(f"{config:<7}" + "".join(f"{med[k]:>10.3f}" for _, k in cols) + f"{f'{hits}/{len(runs)}':>10}{resumed:>8.0f}")
    results.append({"config": config, **{k: round(v, 4) for k, v in med.items()}, "cache_hits": hits,
                    "runs": len(runs), "resumed_from_step": resumed, "lost_steps": kill_step - resumed,
                    "total_s_all": [round(r["total_s"], 4) for r in runs]})
print(json.dumps({"bench": "time_to_resume", "preset": preset, "kill_step": kill_step, "results": results}))
EOF
