#!/usr/bin/env bash
# A kill soak: SIGKILL a supervised training run again and again at random moments, then
# check that nothing was lost.
#
#   bench/resilience/kill_soak.sh [KILLS] [OUT_DIR] [TESSERA]     (from the repository root)
#
# KILLS (default 100) SIGKILLs land on the live worker of one `tessera launch` job, half of
# them (the first KILLS/2) with asynchronous saves and the rest in a second job with
# synchronous ones (SAVES=async or SAVES=sync runs only one kind). Each kill comes at a
# random moment after the worker's start (0.01 to MAX_DELAY_S seconds, default 1.2), so
# kills land during start-up, restore, compile, steps and saves of both tiers; the phase
# each kill hit is read from the worker's heartbeat and counted. The checkpoint settings
# are the defaults (local tier and Young/Daly intervals "auto"); --backoff 0 so that a kill
# during start-up costs no waiting.
#
# Afterwards every job must have finished (exit 0), its final parameters and optimizer
# state must be byte-identical to an uninterrupted run's, every checkpoint left in either
# tier must verify, and no restore may have loaded a checkpoint that failed verification
# (a restore verifies before it loads; the worker logs say which candidates it skipped).
# The log ends with one JSON line: kills, restarts, identical (true/false), kills by phase.
# Exit status 0 when the soak passes.
#
# Environment: STEPS (default 1500) of a 1-layer GPT (dim 64, batch 4, seq 64) on the
# fortunes bytes; SEED (default 1) of the kill timing.
set -euo pipefail

kills_wanted="${1:-100}"
out="${2:-runs/kill-soak}"
tessera="${3:-build/bin/tessera}"
steps="${STEPS:-1500}"
max_delay="${MAX_DELAY_S:-1.2}"
saves="${SAVES:-both}"
RANDOM="${SEED:-1}"
rm -rf "$out"
mkdir -p "$out"
log="$out/soak.log"
: >"$log"
say() { echo "[kill_soak] $*" | tee -a "$log"; }

train_args=(train --config configs/tiny.toml --quiet
  --set data.train="$out/data/train.bin" --set data.val="$out/data/val.bin"
  --set model.layers=1 --set model.dim=64 --set model.heads=2 --set model.context=64
  --set train.steps="$steps" --set train.batch=4 --set train.seq=64 --set train.eval_batches=1
  --set train.eval_interval=0 --set run.tensorboard=false)
# The local tiers go under OUT_DIR, so a failed soak leaves nothing in /dev/shm.
export TESSERA_LOCAL_TIER_ROOT="$out/local"
mkdir -p "$TESSERA_LOCAL_TIER_ROOT"

start=$(date +%s)
say "uninterrupted reference run: $steps steps"
"$tessera" "${train_args[@]}" --set run.dir="$out/straight" >"$out/straight.txt" 2>&1 ||
  { say "FAIL: the uninterrupted run: $(tail -5 "$out/straight.txt")"; exit 1; }
reference="$out/straight/checkpoints/$(printf 'step_%08d' "$steps")"

declare -A by_phase=()
total_kills=0
total_restarts=0
all_identical=true
problems=()

# soak KIND KILLS: one supervised job with checkpoint.async=KIND, killed KILLS times.
soak() {
  local kind="$1" wanted="$2" run="$out/run-$1" beats="$out/beats-$1"
  local async=true
  [[ "$kind" == sync ]] && async=false
  "$tessera" launch --max-restarts $((wanted + 50)) --backoff 0 --heartbeat-dir "$beats" --run-dir "$run" -- \
    "$tessera" "${train_args[@]}" --set checkpoint.async="$async" --set run.dir="$run" \
    >"$out/launch-$kind.txt" 2>&1 &
  local launcher=$! kills=0 last_pid="" phase step pid delay
  while ((kills < wanted)) && kill -0 "$launcher" 2>/dev/null; do
    pid="$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$beats/rank-0.json" 2>/dev/null || true)"
    if [[ -z "$pid" || "$pid" == "$last_pid" ]] || ! kill -0 "$pid" 2>/dev/null; then
      sleep 0.005
      continue
    fi
    # A new worker: kill it at a random moment of its life.
    last_pid="$pid"
    delay="$(awk -v r="$RANDOM" -v m="$max_delay" 'BEGIN { printf "%.3f", 0.01 + (m - 0.01) * r / 32767 }')"
    sleep "$delay"
    phase="$(sed -n 's/.*"phase":"\([a-z]*\)".*/\1/p' "$beats/rank-0.json" 2>/dev/null || true)"
    step="$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$beats/rank-0.json" 2>/dev/null || true)"
    if kill -KILL "$pid" 2>/dev/null; then
      kills=$((kills + 1))
      by_phase[${phase:-none}]=$((${by_phase[${phase:-none}]:-0} + 1))
      echo "kill $kills ($kind): worker $pid after ${delay}s, phase ${phase:-none}, step ${step:-?}" >>"$log"
    fi
  done
  local status=0
  wait "$launcher" || status=$?
  local restarts
  restarts="$(grep -c '"type":"attempt_start"' "$run/goodput/events.jsonl" 2>/dev/null || echo 1)"
  restarts=$((restarts - 1))
  total_kills=$((total_kills + kills))
  total_restarts=$((total_restarts + restarts))
  say "$kind saves: $kills kills, $restarts restarts, launch exited $status"
  ((kills == wanted)) || problems+=("$kind: the run finished after $kills of $wanted kills (raise STEPS)")
  ((status == 0)) || problems+=("$kind: launch exited $status: $(tail -3 "$out/launch-$kind.txt" | tr '\n' ' ')")
  local final="$run/checkpoints/$(printf 'step_%08d' "$steps")" file
  for file in params.safetensors opt_state.safetensors; do
    if ! cmp -s "$reference/$file" "$final/$file"; then
      all_identical=false
      problems+=("$kind: $final/$file differs from the uninterrupted run's (or is missing)")
    fi
  done
  # Every committed checkpoint in both tiers verifies (a kill never leaves a bad one).
  local dir
  for dir in "$run"/checkpoints/step_* "$TESSERA_LOCAL_TIER_ROOT"/tessera-*/run-"$kind"-*/checkpoints/step_*; do
    [[ -d "$dir" ]] || continue
    "$tessera" ckpt verify "$dir" >/dev/null 2>&1 || problems+=("$kind: $dir does not verify")
  done
  # A restore that skipped a candidate says "is corrupt" or "cannot be loaded"; partial
  # saves (a kill mid-write) are reported and never loaded.
  local skipped partial resumed
  skipped="$(grep -cE "is corrupt|cannot be loaded" "$out/launch-$kind.txt" || true)"
  partial="$(grep -c "is a partial save" "$out/launch-$kind.txt" || true)"
  resumed="$(grep -c "resumed from step" "$out/launch-$kind.txt" || true)"
  say "$kind saves: $resumed resumes, $partial partial saves reported and skipped, $skipped committed checkpoints refused"
  ((skipped == 0)) || problems+=("$kind: $skipped committed checkpoints failed verification at restore")
}

case "$saves" in
  both)
    soak async $(((kills_wanted + 1) / 2))
    soak sync $((kills_wanted / 2))
    ;;
  async | sync) soak "$saves" "$kills_wanted" ;;
  *)
    say "FAIL: SAVES=$saves (expected both, async or sync)"
    exit 2
    ;;
esac

phases="{"
for p in "${!by_phase[@]}"; do phases+="\"$p\":${by_phase[$p]},"; done
phases="${phases%,}}"
for p in "${problems[@]}"; do say "FAIL: $p"; done
ok=true
((${#problems[@]} == 0)) || ok=false
say "$total_kills kills in $(($(date +%s) - start)) s; kills by phase: $phases"
echo "{\"kills\":$total_kills,\"restarts\":$total_restarts,\"identical\":$all_identical,\"passed\":$ok,\"steps\":$steps,\"kills_by_phase\":$phases}" | tee -a "$log"
$ok
