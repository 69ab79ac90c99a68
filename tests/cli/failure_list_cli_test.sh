#!/usr/bin/env bash
# A list of injected failures end to end (registered with ctest by cmake/cli_tests.cmake):
#   failure_list_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases:
#   launch_list   `tessera launch --max-restarts 6` with
#                 TESSERA_FAULT="kill@save=3;kill@step=9;kill@restore=2;corrupt_newest" on a tiny
#                 run (16 steps, a checkpoint every 2, asynchronous saves). The attempts:
#                   0: fresh; SIGKILLed on the writer thread in its 3rd save (step 6), after
#                      step 2 and 4 committed (a save waits for the previous one)
#                   1: corrupt_newest flips step 4, which is skipped; the partial step 6 is
#                      reported; resumes from step 2 (restore 1); SIGKILLed at step 9
#                   2: SIGKILLed in restore 2, after verifying the newest checkpoint
#                   3: restores (restore 3) and finishes
#                 so: exit 0, 3 restarts (goodput log and launch output), each fault fired
#                 once, no partial save left, and final params and optimizer state
#                 byte-identical to an uninterrupted run's
#   sync_save     the same kills in save and restore with synchronous saves, one
#                 `tessera train` at a time: exit 137 in save 2 leaves step_00000004.tmp-*
#                 with params but no manifest; the restart reports it, restores step 2 and
#                 is SIGKILLed in that restore; the third start finishes byte-identical
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"

tiny_train_args 16

# Final params and optimizer state of run directory $1 equal the uninterrupted run's.
expect_same_final_state() {
  for file in params.safetensors opt_state.safetensors; do
    [[ -f "$1/checkpoints/step_00000016/$file" ]] || fail "$1 has no final $file"
    cmp -s "$tmp/straight/checkpoints/step_00000016/$file" "$1/checkpoints/step_00000016/$file" ||
      fail "$file after the faults differs from the uninterrupted run's"
  done
}

"$tessera" "${train_args[@]}" --quiet --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
  fail "uninterrupted run: $(tail -5 "$tmp/straight.txt")"

case "$case_name" in
  launch_list)
    faults="kill@save=3;kill@step=9;kill@restore=2;corrupt_newest"
    status=0
    # No --quiet: the trainer's warnings (the partial save, the corrupt checkpoint) are checked.
    TESSERA_FAULT="$faults" "$tessera" launch --nproc 1 --max-restarts 6 --backoff 0 -- \
      "$tessera" "${train_args[@]}" --set run.dir="$tmp/run" >"$tmp/launch.txt" 2>&1 || status=$?
    [[ $status -eq 0 ]] || fail "launch exited $status: $(tail -20 "$tmp/launch.txt")"
    grep -q "succeeded after 4 attempt(s) (3 restart(s)); exit 0" "$tmp/launch.txt" ||
      fail "no summary line with 3 restarts: $(grep -E 'attempt|restart' "$tmp/launch.txt")"
    for fired in "item 1 'kill@save=3': SIGKILL in checkpoint write 3 (step 6)" \
      "item 2 'kill@step=9': SIGKILL at the start of step 9" \
      "item 3 'kill@restore=2': SIGKILL in restore 2 of this run directory" \
      "fault injection: corrupted $tmp/run/checkpoints/step_00000004/params.safetensors" \
      "step_00000006.tmp-[0-9]* is a partial save" \
      "checkpoint $tmp/run/checkpoints/step_00000004 is corrupt" \
      "resumed from step 2"; do
      [[ "$(grep -c -- "$fired" "$tmp/launch.txt")" -eq 1 ]] || fail "not once in the launch output: $fired"
    done
    log="$tmp/run/goodput/events.jsonl"
    [[ "$(grep -c '"type":"attempt_start"' "$log")" -eq 4 ]] || fail "attempt_start lines: $(grep attempt_start "$log")"
    [[ "$(grep '"type":"attempt_start"' "$log" | grep -c "rank 0 killed by SIGKILL")" -eq 3 ]] ||
      fail "restart reasons: $(grep attempt_start "$log")"
    grep '"type":"job_end"' "$log" | tail -1 | grep -q '"status":"ok"' || fail "no successful job_end"
    [[ "$(ls -A "$tmp/run" | grep -c '^\.fault_fired\.')" -eq 4 ]] || fail "fired markers: $(ls -A "$tmp/run")"
    [[ -z "$(ls -d "$tmp"/run/checkpoints/*.tmp-* 2>/dev/null)" ]] || fail "a partial save is left behind"
    expect_same_final_state "$tmp/run"
    ;;
  sync_save)
    sync_args=("${train_args[@]}" --quiet --set checkpoint.async=false --set run.dir="$tmp/run")
    export TESSERA_FAULT="kill@save=2;kill@restore=1"
    status=0
    "$tessera" "${sync_args[@]}" >"$tmp/first.txt" 2>&1 || status=$?
    [[ $status -eq 137 ]] || fail "the first start exited $status, expected 137 (SIGKILL): $(tail -5 "$tmp/first.txt")"
    partial="$(ls -d "$tmp"/run/checkpoints/step_00000004.tmp-* 2>/dev/null)"
    [[ -n "$partial" && -f "$partial/params.safetensors" && ! -e "$partial/manifest.json" ]] ||
      fail "no partial save of step 4 with params and without a manifest: $(ls -R "$tmp/run/checkpoints")"
    [[ ! -d "$tmp/run/checkpoints/step_00000004" ]] || fail "step 4 was committed"
    "$tessera" ckpt verify "$tmp/run" >"$tmp/verify.txt" 2>&1 || fail "after the kill: $(cat "$tmp/verify.txt")"
    status=0
    "$tessera" "${sync_args[@]}" >"$tmp/second.txt" 2>&1 || status=$?
    [[ $status -eq 137 ]] || fail "the second start exited $status, expected 137 (SIGKILL): $(tail -5 "$tmp/second.txt")"
    grep -q "SIGKILL in restore 1 of this run directory, .*step_00000002 read" "$tmp/second.txt" ||
      fail "no kill in restore 1: $(tail -5 "$tmp/second.txt")"
    "$tessera" "${sync_args[@]}" >"$tmp/third.txt" 2>&1 || fail "the third start: $(tail -5 "$tmp/third.txt")"
    expect_same_final_state "$tmp/run"
    ;;
  *)
    fail "unknown case"
    ;;
esac
