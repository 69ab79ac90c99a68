#!/usr/bin/env bash
# A kill soak: SIGKILL a supervised training run again and again at random moments, then
# check that nothing was lost.
#
#   bench/resilience/kill_soak.sh [KILLS] [OUT_DIR] [TESSERA]     (from the repository root)
#
# KILLS (default 100) SIGKILLs land on the live worker of one `tessera launch` job, half of
# them (the first KILLS/2) with asynchronous saves and the rest in a second job with
# synchronous ones (SAVES=async or SAVES=sync runs only one kind). Of each job's kills:
#   * a fifth are TESSERA_FAULT kill@save=2 items: the worker SIGKILLs itself in the middle
#     of its 2nd checkpoint write (params written, manifest and commit not; on the writer
#     thread for an asynchronous save), each item once;
#   * a tenth are kill@restore items: SIGKILL in a restore, after the newest checkpoint was
#     read and verified, before its tensors are loaded;
#   * the rest come from this script at a random moment after a worker's start (0.01 to
#     MAX_DELAY_S seconds, default 1.5; the window doubles after a kill before the
#     worker's first step and narrows back after one in its steps, so a slow start-up on
#     a loaded machine cannot crash-loop the job): during start-up, compile, steps and saves of both
#     tiers; the phase each hit is read from the worker's heartbeat and counted. Checkpoints: the default
# local tier (under OUT_DIR/local) every 5 steps and the persistent tier by Young/Daly
# with checkpoint.mtbf_s = 20 s (about every 40 steps), so that many kills land in a save;
# --backoff 0 so that a kill during start-up costs no waiting.
#
# Afterwards every job must have finished (exit 0), its final parameters and optimizer
# state must be byte-identical to an uninterrupted run's, every checkpoint left in either
# tier must verify, and no restore may have loaded a checkpoint that failed verification
# (a restore verifies before it loads; the worker logs say which candidates it skipped).
# The log ends with one JSON line: kills, restarts, identical (true/false), kills by phase.
# Exit status 0 when the soak passes.
#
# Environment: STEPS (default 2000) of a 2-layer GPT (dim 128, batch 4, seq 128; about
# 20 ms a step on 2 cores) on the fortunes bytes; SEED (default 1) of the kill timing.
set -euo pipefail

kills_wanted="${1:-100}"
out="${2:-runs/kill-soak}"
tessera="${3:-build/bin/tessera}"
steps="${STEPS:-2000}"
max_delay="${MAX_DELAY_S:-1.5}"
saves="${SAVES:-both}"
RANDOM="${SEED:-1}"
rm -rf "$out"
mkdir -p "$out"
log="$out/soak.log"
: >"$log"
say() { echo "[kill_soak] $*" | tee -a "$log"; }

# Not --quiet: the workers' notes (resumed from, partial saves skipped) are counted below.
train_args=(train --config configs/tiny.toml --set train.log_interval=500
  --set data.train="$out/data/train.bin" --set data.val="$out/data/val.bin"
  --set model.layers=2 --set model.dim=128 --set model.heads=2 --set model.context=128
  --set train.steps="$steps" --set train.batch=4 --set train.seq=128 --set train.eval_batches=1
  --set train.eval_interval=0 --set run.tensorboard=false
  --set checkpoint.local_interval=5 --set checkpoint.mtbf_s=20)
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
  local in_save=$((wanted / 5)) in_restore=$((wanted / 10)) faults="" i
  for ((i = 0; i < in_save; i++)); do faults+="kill@save=2;"; done
  for ((i = 1; i <= in_restore; i++)); do faults+="kill@restore=$((3 * i));"; done
  TESSERA_FAULT="${faults%;}" "$tessera" launch --max-restarts $((wanted + 50)) --backoff 0 \
    --heartbeat-dir "$beats" --run-dir "$run" -- \
    "$tessera" "${train_args[@]}" --set checkpoint.async="$async" --set run.dir="$run" \
    >"$out/launch-$kind.txt" 2>&1 &
  local launcher=$! kills=0 last_pid="" phase step pid delay window="$max_delay"
  # Until the attempts killed so far and the injected kills still to fire make `wanted`
  # (the launcher's log counts what died: two kills can meet in one worker), and every
  # kill@restore=N has fired: it needs N restores, and a worker killed before the first
  # checkpoint restores nothing, so kills from outside go on until enough restores happened.
  while kill -0 "$launcher" 2>/dev/null; do
    local died unfired restores_pending
    died="$(grep -c "failed after .* killed by SIGKILL" "$out/launch-$kind.txt" 2>/dev/null || true)"
    unfired=$((in_save + in_restore - $(ls -A "$run" 2>/dev/null | grep -c '^\.fault_fired\.' || true)))
    restores_pending=$((in_restore - $(ls -A "$run" 2>/dev/null | grep -c '^\.fault_fired\..*kill@restore' || true)))
    ((died + unfired < wanted || restores_pending > 0)) || break
    pid="$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$beats/rank-0.json" 2>/dev/null || true)"
    if [[ -z "$pid" || "$pid" == "$last_pid" ]] || ! kill -0 "$pid" 2>/dev/null; then
      sleep 0.005
      continue
    fi
    # A new worker: kill it at a random moment of its life (within `window` seconds).
    last_pid="$pid"
    delay="$(awk -v r="$RANDOM" -v m="$window" 'BEGIN { printf "%.3f", 0.01 + (m - 0.01) * r / 32767 }')"
    sleep "$delay"
    phase="$(sed -n 's/.*"phase":"\([a-z]*\)".*/\1/p' "$beats/rank-0.json" 2>/dev/null || true)"
    step="$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$beats/rank-0.json" 2>/dev/null || true)"
    # Not a worker that already died (a zombie until the launcher reaps it, e.g. after an
    # injected kill): that kill would count but kill nothing.
    [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" =~ ^[RSDt]$ ]] || continue
    if kill -KILL "$pid" 2>/dev/null; then
      kills=$((kills + 1))
      by_phase[${phase:-none}]=$((${by_phase[${phase:-none}]:-0} + 1))
      # A worker killed before its first step made no progress. On a loaded machine (the
      # sanitizer tree beside other tests) start-up can outlast MAX_DELAY_S every time, and
      # the job would only crash-loop: widen the window until kills land past start-up,
      # then narrow it back.
      case "${phase:-none}" in
        none | startup | compile | restore) window="$(awk -v w="$window" 'BEGIN { printf "%.3f", (w * 2 > 60 ? 60 : w * 2) }')" ;;
        *) window="$(awk -v w="$window" -v m="$max_delay" 'BEGIN { printf "%.3f", (w / 2 < m ? m : w / 2) }')" ;;
      esac
      echo "kill $kills ($kind): worker $pid after ${delay}s, phase ${phase:-none}, step ${step:-?}" >>"$log"
    fi
  done
  local status=0
  wait "$launcher" || status=$?
  local fired_save fired_restore
  fired_save="$(ls -A "$run" | grep -c '^\.fault_fired\..*kill@save' || true)"
  fired_restore="$(ls -A "$run" | grep -c '^\.fault_fired\..*kill@restore' || true)"
  by_phase[save-injected]=$((${by_phase[save-injected]:-0} + fired_save))
  by_phase[restore-injected]=$((${by_phase[restore-injected]:-0} + fired_restore))
  say "$kind saves: $kills kills from outside, $fired_save of $in_save kill@save and $fired_restore of $in_restore kill@restore fired"
  ((fired_save == in_save && fired_restore == in_restore)) ||
    problems+=("$kind: not every injected kill fired (the run finished first: raise STEPS)")
  kills=$((kills + fired_save + fired_restore))
  # What the launcher saw: each SIGKILL is a failed attempt, each failed attempt a restart.
  local restarts sigkilled
  restarts="$(sed -n 's/.*succeeded after [0-9]* attempt(s) (\([0-9]*\) restart(s)).*/\1/p' "$out/launch-$kind.txt")"
  restarts="${restarts:-0}"
  sigkilled="$(grep -c "failed after .* killed by SIGKILL" "$out/launch-$kind.txt" || true)"
  ((sigkilled == kills)) || say "$kind: $kills kills sent or injected, $sigkilled attempts died of SIGKILL (two at once hit one worker): counting $sigkilled"
  kills="$sigkilled"
  ((kills >= wanted)) || problems+=("$kind: the run finished after $kills of $wanted kills (raise STEPS)")
  total_kills=$((total_kills + kills))
  total_restarts=$((total_restarts + restarts))
  say "$kind saves: $kills kills, $restarts restarts, launch exited $status"
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
