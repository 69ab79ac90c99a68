#!/usr/bin/env bash
# Fault injection end to end (registered with ctest by cmake/cli_tests.cmake):
#   fault_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases:
#   kill_resume   `tessera train` with TESSERA_FAULT=kill@step=5 dies by SIGKILL after 5
#                 steps; the same command again (same TESSERA_FAULT: the fault fires once per
#                 run directory) resumes from its newest committed checkpoint and finishes, with final params and
#                 optimizer files byte-identical to an uninterrupted run's
#   kill_resume_pipeline
#                 the same through the data pipeline (a token file and a directory of
#                 text files mixed 2:1, documents packed, 2 prefetch workers); the resume
#                 runs with 0 workers and must still be byte-identical
#   hang          hang@step=2 sleeps until killed (timeout -s KILL 8 -> exit 137); step 2's
#                 background save still commits while the main thread hangs
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"

tiny_train_args 8 --quiet

case "$case_name" in
  kill_resume)
    "$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted run: $(tail -5 "$tmp/straight.txt")"
    status=0
    TESSERA_FAULT="kill@step=5" "$tessera" "${train_args[@]}" --set run.dir="$tmp/run" >"$tmp/first.txt" 2>&1 ||
      status=$?
    [[ $status -eq 137 ]] || fail "the first attempt exited with $status, expected 137 (SIGKILL): $(tail -5 "$tmp/first.txt")"
    # Step 4's asynchronous save may have been in flight at the kill: what is committed
    # (step 2, maybe 4) verifies, and nothing past the kill exists.
    [[ -d "$tmp/run/checkpoints/step_00000002" ]] || fail "no checkpoint at step 2 before the kill"
    [[ ! -d "$tmp/run/checkpoints/step_00000006" ]] || fail "a checkpoint past the kill step exists"
    "$tessera" ckpt verify "$tmp/run" >"$tmp/verify.txt" 2>&1 || fail "after the kill: $(cat "$tmp/verify.txt")"
    # The restart keeps the fault spec, as a scheduler rerunning the same command would.
    TESSERA_FAULT="kill@step=5" "$tessera" "${train_args[@]}" --set run.dir="$tmp/run" >"$tmp/second.txt" 2>&1 ||
      fail "resume: $(tail -5 "$tmp/second.txt")"
    cmp -s "$tmp/straight/checkpoints/step_00000008/params.safetensors" \
      "$tmp/run/checkpoints/step_00000008/params.safetensors" ||
      fail "params after the kill and resume differ from the uninterrupted run's"
    cmp -s "$tmp/straight/checkpoints/step_00000008/opt_state.safetensors" \
      "$tmp/run/checkpoints/step_00000008/opt_state.safetensors" ||
      fail "optimizer state after the kill and resume differs from the uninterrupted run's"
    ;;
  kill_resume_pipeline)
    mkdir -p "$tmp/notes"
    for i in 1 2 3; do
      for line in $(seq 1 60); do echo "note $i, line $line: what the data pipeline mixes in."; done >"$tmp/notes/$i.txt"
    done
    mixture="data.mixture=[{path = \"$tmp/data/train.bin\", weight = 2, documents = 10}, {name = \"notes\", path = \"$tmp/notes\"}]"
    pipeline_args=("${train_args[@]}" --set "$mixture" --set data.packing=documents --set data.prefetch=3)
    "$tessera" "${pipeline_args[@]}" --set data.workers=2 --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted run: $(tail -5 "$tmp/straight.txt")"
    status=0
    TESSERA_FAULT="kill@step=5" "$tessera" "${pipeline_args[@]}" --set data.workers=2 --set run.dir="$tmp/run" \
      >"$tmp/first.txt" 2>&1 || status=$?
    [[ $status -eq 137 ]] || fail "the first attempt exited with $status, expected 137 (SIGKILL): $(tail -5 "$tmp/first.txt")"
    TESSERA_FAULT="kill@step=5" "$tessera" "${pipeline_args[@]}" --set data.workers=0 --set run.dir="$tmp/run" \
      >"$tmp/second.txt" 2>&1 || fail "resume: $(tail -5 "$tmp/second.txt")"
    grep -q -- "-> 8 (steps), resumed" "$tmp/second.txt" || fail "the second run did not resume: $(head -3 "$tmp/second.txt")"
    for file in params opt_state; do
      cmp -s "$tmp/straight/checkpoints/step_00000008/$file.safetensors" \
        "$tmp/run/checkpoints/step_00000008/$file.safetensors" ||
        fail "$file after the kill and a resume with another worker count differs from the uninterrupted run's"
    done
    ;;
  hang)
    status=0
    TESSERA_FAULT="hang@step=2" timeout -s KILL 8 "$tessera" "${train_args[@]}" --set run.dir="$tmp/run" \
      >"$tmp/hang.txt" 2>&1 || status=$?
    [[ $status -eq 137 ]] || fail "the hung run exited with $status, expected 137 (killed by timeout)"
    [[ -d "$tmp/run/checkpoints/step_00000002" ]] || fail "no checkpoint at step 2 before the hang"
    ;;
  *)
    fail "unknown case"
    ;;
esac
