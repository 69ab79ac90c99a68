#!/usr/bin/env bash
# `tessera launch --srun` under a real Slurm (slurmctld + a slurmd per test host, from
# tools/testbed.sh; registered with ctest by cmake/cli_tests.cmake under the label multihost):
#   slurm_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Every case submits `sbatch -N 2 --ntasks-per-node=1` of `tessera launch --srun --nproc 2 --
# tessera train --mesh data=2` (the ranks are one MPI job started by srun through PMIx)
# and compares with the same mesh in one process (2 virtual devices):
#   kill_restart    rank 1 SIGKILLed at step 5: srun ends the step, the launcher starts a
#                   new one, the job finishes byte-identical to the one-process run
#   budget_requeue  the same kill with --max-restarts 0: the launcher exits 75, Slurm
#                   requeues the job (RequeueExit=75), the requeued run resumes from its
#                   checkpoint and finishes byte-identical (a run whose srun fails before
#                   any step, as on a loaded machine, is requeued too and is allowed)
#   scancel         `scancel` of a running job: the ranks get SIGTERM, save a checkpoint
#                   of the step they reached and stop; the checkpoint verifies
#   queue_wait      a job that waits behind another for both nodes: the launcher reads the
#                   wait from Slurm (scontrol) and `tessera goodput` reports it as scheduling
#                   wait, so scheduling goodput is measured
# Needs root, network namespaces and Slurm (tools/testbed.sh check / slurm up say what is
# missing); skips with the reason otherwise.
source "$(dirname "$0")/cli_common.sh" "$@"

testbed="$src/tools/testbed.sh"
reason="$("$testbed" check 2>&1)" || skip "no test hosts here: $reason"
for tool in slurmctld slurmd sbatch munged; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (make deps installs slurm-wlm and munge)"
done
trap '"$testbed" down; rm -rf "$tmp"' EXIT
"$testbed" up 2
"$testbed" slurm up
on_host() { "$testbed" exec tbh1 "$@"; }

# The job: both ranks, one per node, through the launcher. TESSERA_* and the launch options
# come from the arguments: job.sh RUN_DIR LAUNCH_OPTIONS... (run with bash by sbatch).
steps=8
[[ "$case_name" == scancel ]] && steps=100000
tiny_train_args "$steps" --quiet --mesh data=2
[[ "$case_name" == scancel ]] && train_args+=(--set checkpoint.interval=100000)  # only the SIGTERM save
cat >"$tmp/job.sh" <<JOB
#!/usr/bin/env bash
# As root, in a container (see cmake/mpi_tests.cmake).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
run_dir="\$1"
shift
echo "job \$SLURM_JOB_ID on \$SLURM_JOB_NODELIST, restart \${SLURM_RESTART_COUNT:-0}"
exec $(printf '%q ' "$tessera") launch --srun --nproc 2 --backoff 0 "\$@" -- \\
  $(printf '%q ' "$tessera" "${train_args[@]}") --set run.dir="\$run_dir"
JOB
submit() {  # submit [sbatch options] -- RUN_DIR [launch options]: prints the job id
  local options=()
  while [[ "$1" != -- ]]; do options+=("$1"); shift; done
  shift
  on_host sbatch --parsable -N 2 --ntasks-per-node=1 --chdir="$src" --output="$tmp/job-%j.out" "${options[@]}" \
    "$tmp/job.sh" "$@"
}
job_field() {  # JOB FIELD: a field of `scontrol show job -o`
  on_host scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
wait_for_job() {  # JOB SECONDS: until it has ended for good (not pending a requeue)
  local state=""
  for _ in $(seq "$(($2 * 5))"); do
    state="$(job_field "$1" JobState)"
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac
    sleep 0.2
  done
  fail "job $1 still $state after $2 s: $(cat "$tmp"/job-"$1".out 2>/dev/null | tail -20)"
}
one_process_run() {
  TESSERA_CPU_DEVICES=2 "$tessera" "${train_args[@]}" --set run.dir="$tmp/one" >"$tmp/one.txt" 2>&1 ||
    fail "the one-process run: $(tail -5 "$tmp/one.txt")"
}
same_final_state() {  # run dir, what
  for f in params.safetensors opt_state.safetensors; do
    cmp -s "$tmp/one/checkpoints/step_0000000$steps/$f" "$1/checkpoints/step_0000000$steps/$f" ||
      fail "$2: $f differs from the one-process run's"
  done
}

case "$case_name" in
  kill_restart)
    one_process_run
    # --hang-timeout 60: the surviving rank waits in its all-reduce until srun ends the step
    # (SIGTERM, then SIGKILL after the testbed's KillWait of 10 s); under load the hang
    # detector's automatic timeout (a 3 s floor) could end the attempt first. This case
    # checks srun's path; the hang detector has its own tests.
    job="$(TESSERA_FAULT="kill@step=5,rank=1" submit -- "$tmp/slurm" --max-restarts 2 --hang-timeout 60)" ||
      fail "sbatch failed"
    wait_for_job "$job" 120
    out="$tmp/job-$job.out"
    [[ "$(job_field "$job" JobState) $(job_field "$job" ExitCode)" == "COMPLETED 0:0" ]] ||
      fail "job $job: $(job_field "$job" JobState) $(job_field "$job" ExitCode): $(tail -20 "$out")"
    grep -q "job $job on tbh\[1-2\]" "$out" || fail "not on both nodes: $(head -3 "$out")"
    grep -q "mesh (data=2) (mpi (rank 0 of 2))" "$out" || fail "not one MPI job of 2 ranks: $(cat "$out")"
    grep -Eq "attempt 0 failed after .*: srun (exit|killed)" "$out" || fail "no failed attempt: $(grep launch: "$out")"
    grep -q "succeeded after 2 attempt(s) (1 restart(s)); exit 0" "$out" || fail "no summary: $(grep launch: "$out")"
    [[ -n "$(ls "$tmp"/slurm/.fault_fired.*rank1 2>/dev/null)" ]] || fail "the fault did not fire on rank 1"
    same_final_state "$tmp/slurm" "after the kill and the restart under Slurm"
    ;;
  budget_requeue)
    one_process_run
    job="$(TESSERA_FAULT="kill@step=5,rank=1" submit --requeue -- "$tmp/slurm" --max-restarts 0 --hang-timeout 60)" ||
      fail "sbatch failed"
    wait_for_job "$job" 180
    out="$tmp/job-$job.out"
    log="$tmp/slurm/goodput/events.jsonl"
    failures() { grep '"type":"failure"' "$log" 2>/dev/null || true; }
    # Every run that fails exits 75 and is requeued, so the job's restarts are the goodput
    # log's failures: the kill at step 5, and under a loaded machine possibly a run whose
    # srun failed before any step (the requeue is for that too; CI once saw one). Any
    # other failure fails the case.
    restarts="$(job_field "$job" Restarts)"
    [[ "$(job_field "$job" JobState)" == COMPLETED && "$restarts" -ge 1 ]] ||
      fail "job $job: $(job_field "$job" JobState), restarts $restarts: $(tail -20 "$out"); failures: $(failures)"
    [[ "$(failures | wc -l)" -eq "$restarts" ]] ||
      fail "job $job restarted $restarts time(s) but the goodput log holds these failures: $(failures)"
    [[ "$(failures | grep -c 'at step')" -eq 1 ]] ||
      fail "expected one failure after progress (the kill at step 5): $(failures)"
    [[ "$(failures | grep -c 'before its first step')" -eq "$((restarts - 1))" ]] ||
      fail "a failure neither the kill nor before the first step: $(failures)"
    [[ "$restarts" -eq 1 ]] || echo "note: $((restarts - 1)) extra requeue(s) before any step: $(failures)"
    # The output file holds the last run (Slurm truncates it); the failed runs' exit 75 is
    # in the goodput log as failed attempts and in the controller's log.
    grep -q "job $job on tbh\[1-2\], restart $restarts" "$out" || fail "the requeued run: $(head -3 "$out")"
    grep -q "succeeded after 1 attempt(s) (0 restart(s)); exit 0" "$out" || fail "no summary: $(grep launch: "$out")"
    # One goodput log for the job: an attempt per run, and each run's wait in the queue
    # (after the first: the requeue) from Slurm.
    [[ "$(grep -c '"type":"attempt_start"' "$log")" -eq "$((restarts + 1))" ]] ||
      fail "expected $((restarts + 1)) attempts in the goodput log: $(grep -E 'attempt_start|failure' "$log")"
    [[ "$(grep -c '"type":"launch_wait"' "$log")" -eq "$((restarts + 1))" ]] ||
      fail "expected a queue wait per run: $(grep launch_wait "$log")"
    same_final_state "$tmp/slurm" "after the requeue"
    ;;
  scancel)
    job="$(submit -- "$tmp/slurm" --max-restarts 0)" || fail "sbatch failed"
    logged_steps() { cat "$tmp/slurm/metrics.jsonl" 2>/dev/null | grep -c '"step"' || true; }
    for _ in $(seq 300); do  # until rank 0 has logged a few steps
      [[ "$(logged_steps)" -ge 3 ]] && break
      sleep 0.2
    done
    [[ "$(logged_steps)" -ge 3 ]] || fail "the job did not start training: $(tail -20 "$tmp/job-$job.out" 2>/dev/null)"
    on_host scancel "$job"
    wait_for_job "$job" 60
    out="$tmp/job-$job.out"
    [[ "$(job_field "$job" JobState)" == CANCELLED ]] || fail "job $job: $(job_field "$job" JobState)"
    grep -q "launch: launcher stopped by SIGTERM" "$out" || fail "the launcher did not get SIGTERM: $(tail -20 "$out")"
    saved="$(ls -d "$tmp"/slurm/checkpoints/step_* 2>/dev/null | tail -1 || true)"
    [[ -n "$saved" ]] || fail "no checkpoint after scancel: $(tail -20 "$out")"
    [[ "$(basename "$saved")" != step_00000000 ]] || fail "only the initial checkpoint"
    "$tessera" ckpt verify "$tmp/slurm" >"$tmp/verify.txt" 2>&1 || fail "after scancel: $(cat "$tmp/verify.txt")"
    ;;
  queue_wait)
    # A job that holds both nodes for 6 s, then ours, which queues behind it.
    blocker="$(on_host sbatch --parsable -N 2 --exclusive --output=/dev/null --wrap "sleep 6")" || fail "sbatch failed"
    job="$(submit -- "$tmp/slurm" --max-restarts 0)" || fail "sbatch failed"
    wait_for_job "$job" 120
    out="$tmp/job-$job.out"
    [[ "$(job_field "$job" JobState)" == COMPLETED ]] || fail "job $job: $(job_field "$job" JobState): $(tail -20 "$out")"
    grep -Eq "launch: slurm job $job waited [0-9.]+ s in the queue" "$out" || fail "no queue wait: $(grep launch: "$out")"
    "$tessera" goodput "$tmp/slurm" --json >"$tmp/goodput.json" || fail "tessera goodput --json failed"
    python3 - "$tmp/goodput.json" <<'PY' || fail "goodput of the queued job: $(head -c 1500 "$tmp/goodput.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["has_scheduling_records"] is True
wait = r["total_s"] * (1 - r["scheduling_goodput"])
assert 3 <= wait <= 60, wait  # behind a 6 s job
PY
    [[ "$(job_field "$blocker" JobState)" == COMPLETED ]] || fail "the blocker job: $(job_field "$blocker" JobState)"
    ;;
  *)
    fail "unknown case"
    ;;
esac
