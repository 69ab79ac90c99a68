#!/usr/bin/env bash
# `tessera launch --mpi` and `--srun` end to end (registered with ctest by cmake/cli_tests.cmake):
#   launch_modes_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE [MPIEXEC]
# Cases:
#   mpi_kill     a 2-rank data-parallel run (`--mesh data=2`) under `tessera launch --mpi
#                --nproc 2 --max-restarts 2` with TESSERA_FAULT=kill@step=5,rank=1: rank 1
#                is SIGKILLed, mpirun ends the job, the launcher restarts it as a whole, and
#                the final params and optimizer state are byte-identical to an uninterrupted
#                `mpirun -n 2` run's. MPIEXEC (cmake's TESSERA_MPIEXEC) is put first in PATH
#                as `mpirun`, the name the launcher runs.
#   srun_kill    `tessera launch --srun --nproc 2` with tests/cli/srun_stand_in/srun first in
#                PATH (Slurm is not running here): two tasks, each an independent single-process
#                trainer in its own run directory (the stand-in has no PMI, so no MPI job);
#                task 1 is SIGKILLed at step 5, the stand-in stops task 0 (--kill-on-bad-exit;
#                SIGTERM: it saves and exits), the launcher restarts both, and both finish
#                byte-identical to one uninterrupted run
#   srun_budget  the same with --max-restarts 0: the launcher exits 75 (EX_TEMPFAIL, requeue)
#                and what the killed task committed verifies
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"
mpiexec="${4:-}"

tiny_train_args 8 --quiet

same_final_state() {  # reference run dir, run dir, what
  for f in params.safetensors opt_state.safetensors; do
    cmp -s "$1/checkpoints/step_00000008/$f" "$2/checkpoints/step_00000008/$f" ||
      fail "$3: $f differs from the uninterrupted run's"
  done
}

mkdir -p "$tmp/bin"
case "$case_name" in
  mpi_kill)
    [[ -n "$mpiexec" ]] || fail "no MPIEXEC argument"
    ln -s "$mpiexec" "$tmp/bin/mpirun"
    export PATH="$tmp/bin:$PATH"
    # As root, in a container, on 2 cores (see cmake/mpi_tests.cmake).
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMPI_MCA_rmaps_base_oversubscribe=1
    train_args+=(--mesh data=2)
    mpirun -n 2 "$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted 2-rank run: $(tail -5 "$tmp/straight.txt")"
    status=0
    TESSERA_FAULT="kill@step=5,rank=1" "$tessera" launch --mpi --nproc 2 --max-restarts 2 --backoff 0 -- \
      "$tessera" "${train_args[@]}" --set run.dir="$tmp/launched" >"$tmp/launch.txt" 2>&1 || status=$?
    [[ $status -eq 0 ]] || fail "launch --mpi exited $status: $(tail -5 "$tmp/launch.txt")"
    grep -q "attempt 0 failed after .*: mpirun exit 137" "$tmp/launch.txt" ||
      fail "no failed attempt for rank 1's SIGKILL: $(grep launch: "$tmp/launch.txt")"
    grep -q "succeeded after 2 attempt(s) (1 restart(s)); exit 0" "$tmp/launch.txt" ||
      fail "no summary line: $(grep launch: "$tmp/launch.txt")"
    [[ -n "$(ls "$tmp"/launched/.fault_fired.*rank1 2>/dev/null)" ]] || fail "the fault did not fire on rank 1"
    same_final_state "$tmp/straight" "$tmp/launched" "2 ranks after the kill and the restart"
    log="$tmp/launched/goodput/events.jsonl"
    [[ "$(grep -c '"type":"attempt_start"' "$log")" -eq 2 ]] || fail "attempt_start lines: $(grep attempt_start "$log")"
    ;;
  srun_kill | srun_budget)
    ln -s "$src/tests/cli/srun_stand_in/srun" "$tmp/bin/srun"
    export PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4242
    "$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted run: $(tail -5 "$tmp/straight.txt")"
    # Each task trains alone in its own directory; the fault is armed in task 1 only.
    printf '%s\n' '#!/usr/bin/env bash' \
      '[[ "$SLURM_PROCID" == 1 ]] && export TESSERA_FAULT="kill@step=5"' \
      "exec $(printf '%q ' "$tessera" "${train_args[@]}") --set run.dir=\"$tmp/task\$SLURM_PROCID\"" >"$tmp/task.sh"
    chmod +x "$tmp/task.sh"
    restarts=2
    [[ "$case_name" == srun_budget ]] && restarts=0
    status=0
    "$tessera" launch --srun --nproc 2 --max-restarts $restarts --backoff 0 --run-dir "$tmp/job" -- "$tmp/task.sh" \
      >"$tmp/launch.txt" 2>&1 || status=$?
    # The stand-in exits with the worst task status: 137 for the killed task, or 143 when
    # task 0 was ended by the stand-in's SIGTERM after its own handler was gone (it had
    # already finished its 8 steps, as happens on a loaded machine).
    grep -Eq "attempt 0 failed after .*: srun exit (137|143)" "$tmp/launch.txt" ||
      fail "no failed attempt for task 1's SIGKILL: $(grep launch: "$tmp/launch.txt")"
    if [[ "$case_name" == srun_kill ]]; then
      [[ $status -eq 0 ]] || fail "launch --srun exited $status: $(tail -5 "$tmp/launch.txt")"
      grep -q "succeeded after 2 attempt(s) (1 restart(s)); exit 0" "$tmp/launch.txt" ||
        fail "no summary line: $(grep launch: "$tmp/launch.txt")"
      same_final_state "$tmp/straight" "$tmp/task0" "task 0 (stopped by the stand-in, restarted)"
      same_final_state "$tmp/straight" "$tmp/task1" "task 1 (killed, restarted)"
    else
      [[ $status -eq 75 ]] || fail "a spent budget: launch --srun exited $status, expected 75"
      grep -q "no restarts left (--max-restarts 0)" "$tmp/launch.txt" || fail "budget line: $(cat "$tmp/launch.txt")"
      [[ ! -d "$tmp/task1/checkpoints/step_00000008" ]] || fail "task 1 finished although it was killed"
      "$tessera" ckpt verify "$tmp/task1" >"$tmp/verify.txt" 2>&1 || fail "after the kill: $(cat "$tmp/verify.txt")"
    fi
    ;;
  *)
    fail "unknown case"
    ;;
esac
