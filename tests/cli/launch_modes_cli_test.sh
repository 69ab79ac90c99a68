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
#   mpi_term_one_rank
#                `mpirun -n 2 tessera train --mesh data=2` where only rank 1 gets SIGTERM
#                (TESSERA_FAULT term@step=5,rank=1), as when a preemption notice reaches
#                one host first: both ranks stop after that step (they agree on every
#                stop), save one checkpoint and exit 0 instead of rank 0 waiting forever in
#                the next step; the same command then resumes to a final state byte-identical to an
#                uninterrupted run's
#   mpi_pipeline_shards
#                the same stop and resume on `mpirun -n 4 tessera train --mesh
#                pipeline=2,fsdp=2` keeping the stages' activations: each process holds its
#                device's shards of its stages' parameters and moments (the summary says
#                so), the stop's checkpoint is gathered from the shards, and the resumed run
#                ends byte-identical to an uninterrupted one
#   srun_kill    `tessera launch --srun --nproc 2` with tests/cli/srun_stand_in/srun first in
#                PATH (Slurm is not running here): two tasks, each an independent single-process
#                trainer in its own run directory (the stand-in has no PMI, so no MPI job);
#                task 1 is SIGKILLed at step 5, the stand-in stops task 0 (--kill-on-bad-exit;
#                SIGTERM: it saves and exits), the launcher restarts both, and both finish
#                byte-identical to one uninterrupted run
#   srun_budget  the same with --max-restarts 0: the launcher exits 75 (EX_TEMPFAIL, requeue)
#                and what the killed task committed verifies
#   srun_stand_in_status
#                the stand-in itself, 300 times: task 1 SIGKILLs itself after 0-40 ms while
#                task 0 sleeps as long and exits 0 on SIGTERM; the stand-in must exit 137
#                (143 if task 0 got the SIGTERM before setting its trap) every time (bash's
#                `wait -n` loses a job whose end it already reported, which made about 1 run
#                in 60 exit 1), and 3 tasks exiting 3, 4 and 5 give 5
#   srun_queue_wait
#                inside a Slurm job, `tessera launch` asks Slurm how long the job queued
#                (tests/cli/srun_stand_in/scontrol: submitted 120 s before it started) and
#                records it as scheduling wait: `tessera goodput` then reports a scheduling
#                goodput below 100% from launcher records, not the 100% "(no launcher
#                records)"; without a usable scontrol the launcher says why and records none
#   fork_stragglers, srun_stragglers, mpi_stragglers
#                a 2-rank job under `tessera launch` (fork workers, the srun stand-in's tasks,
#                or `--mpi` on a `--mesh data=2` run) with rank 1 slowed by 800 ms on two
#                steps (TESSERA_FAULT slow@step=3 and slow@step=5, rank=1: recorded as steps 4
#                and 6): every rank wrote goodput/events.rank-R.jsonl into the launcher's run
#                directory, rank 0 alone the job's log, and `tessera goodput` (text, --json,
#                --html) names rank 1 as the slowest rank with steps 4 and 6 as the worst.
#                Fork workers and srun stand-in tasks share no communicator: each trains in a
#                run directory of its own.
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

# The straggler checks of the *_stragglers cases: JOB_DIR.
check_stragglers() {
  local job="$1"
  for rank in 0 1; do
    local log="$job/goodput/events.rank-$rank.jsonl"
    [[ -f "$log" ]] || fail "no per-rank log $log: $(ls "$job/goodput")"
    [[ "$(grep -c '"type":"rank_step"' "$log")" -eq 8 ]] || fail "rank $rank: $(grep -c rank_step "$log") step records"
  done
  [[ "$(grep -c '"type":"step_end"' "$job/goodput/events.jsonl")" -eq 8 ]] ||
    fail "the job log holds $(grep -c step_end "$job/goodput/events.jsonl") step_end lines, expected rank 0's 8"
  "$tessera" goodput "$job" --html "$tmp/report.html" >"$tmp/goodput.txt" || fail "tessera goodput failed"
  cat "$tmp/goodput.txt"
  grep -q "stragglers: 2 ranks recorded, 8 steps compared" "$tmp/goodput.txt" || fail "no straggler summary"
  grep -q "slowest rank overall: rank 1 " "$tmp/goodput.txt" || fail "rank 1 is not named the slowest"
  # Each slowed step: rank 1 took over 0.8 s, 0.6 s or more above the fastest rank (on a
  # loaded machine the other rank's step may take 0.2 s), so 0.3 s above the median of two.
  grep -Eq "worst step [46]: rank 1 took [0-9.]+ s" "$tmp/goodput.txt" || fail "the worst step is not step 4 or 6"
  grep -Eq "      step [46]: rank 1 took [0-9.]+ s" "$tmp/goodput.txt" || fail "the second worst is not step 4 or 6"
  "$tessera" goodput "$job" --json >"$tmp/goodput.json" || fail "tessera goodput --json failed"
  python3 - "$tmp/goodput.json" <<'PY' || fail "--json stragglers: $(grep -A3 '"lost_s"' "$tmp/goodput.json" | head -8)"
import json, sys
s = json.load(open(sys.argv[1]))["stragglers"]
assert s["slowest_rank"] == 1 and s["world_size"] == 2, s["slowest_rank"]
worst = {w["step"]: w for w in s["worst"][:2]}
assert set(worst) == {4, 6}, list(worst)
assert all(w["slowest_rank"] == 1 and w["slowest_s"] >= 0.8 and w["slowest_s"] - w["fastest_s"] >= 0.6
           and w["excess_s"] >= 0.3 for w in worst.values()), worst
assert s["lost_s"] >= 0.6, s["lost_s"]
PY
  grep -q 'id="stragglers"' "$tmp/report.html" || fail "no straggler section in the HTML report"
}
slow_rank_1="slow@step=3,ms=800,rank=1;slow@step=5,ms=800,rank=1"

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
    # Both ranks' step records survive the kill and the restart, each under its attempt
    # (steps 1-5 in attempt 0, again from the last committed checkpoint in attempt 1).
    "$tessera" goodput "$tmp/launched" >"$tmp/goodput.txt" || fail "tessera goodput after the restart failed"
    cat "$tmp/goodput.txt"
    grep -q "stragglers: 2 ranks recorded" "$tmp/goodput.txt" || fail "no straggler section after the restart"
    "$tessera" goodput "$tmp/launched" --json >"$tmp/goodput.json" || fail "tessera goodput --json failed"
    python3 -c "
import json
steps = json.load(open('$tmp/goodput.json'))['stragglers']['steps']
assert [s['step'] for s in steps if s['attempt'] == 0] == [1, 2, 3, 4, 5], steps
assert [s['step'] for s in steps if s['attempt'] == 1][-1] == 8, steps
" || fail "compared steps by attempt: $(grep -c '"excess_s"' "$tmp/goodput.json") entries"
    for rank in 0 1; do
      grep -q '"type":"rank_step"' "$tmp/launched/goodput/events.rank-$rank.jsonl" || fail "no step records of rank $rank"
      [[ "$(grep -c '"type":"rank_start"' "$tmp/launched/goodput/events.rank-$rank.jsonl")" -eq 2 ]] ||
        fail "rank $rank: one rank_start per attempt expected"
    done
    ;;
  mpi_term_one_rank)
    [[ -n "$mpiexec" ]] || fail "no MPIEXEC argument"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMPI_MCA_rmaps_base_oversubscribe=1
    train_args+=(--mesh data=2)
    "$mpiexec" -n 2 "$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted 2-rank run: $(tail -5 "$tmp/straight.txt")"
    status=0
    TESSERA_FAULT="term@step=5,rank=1" timeout 90 "$mpiexec" -n 2 "$tessera" "${train_args[@]}" \
      --set run.dir="$tmp/stopped" >"$tmp/stopped.txt" 2>&1 || status=$?
    [[ $status -ne 124 ]] || fail "the ranks did not stop together (rank 0 waited in step 6): $(tail -5 "$tmp/stopped.txt")"
    [[ $status -eq 0 ]] || fail "the stopped run exited $status: $(tail -8 "$tmp/stopped.txt")"
    # Rank 0 (which prints the summary) stopped for rank 1's signal, after the step in
    # which it arrived (the fault's step 5 is the run's sixth).
    grep -Eq "steps +0 -> 6 \(signal SIGTERM \(on another rank\)\)" "$tmp/stopped.txt" ||
      fail "rank 0 did not stop for rank 1's signal: $(cat "$tmp/stopped.txt")"
    [[ -d "$tmp/stopped/checkpoints/step_00000006" ]] || fail "no checkpoint at step 6: $(ls "$tmp/stopped/checkpoints")"
    [[ ! -d "$tmp/stopped/checkpoints/step_00000007" ]] || fail "a rank went on past step 6"
    "$tessera" ckpt verify "$tmp/stopped" >"$tmp/verify.txt" 2>&1 || fail "the stop's checkpoint: $(cat "$tmp/verify.txt")"
    "$mpiexec" -n 2 "$tessera" "${train_args[@]}" --set run.dir="$tmp/stopped" >"$tmp/resumed.txt" 2>&1 ||
      fail "the resumed run: $(tail -5 "$tmp/resumed.txt")"
    same_final_state "$tmp/straight" "$tmp/stopped" "stopped by one rank's SIGTERM, resumed"
    ;;
  mpi_pipeline_shards)
    [[ -n "$mpiexec" ]] || fail "no MPIEXEC argument"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMPI_MCA_rmaps_base_oversubscribe=1
    # Without --quiet: the summary's parallel block. Two layers, one per stage.
    tiny_train_args 8 --mesh pipeline=2,fsdp=2 --set parallel.pipeline_recompute=false
    train_args+=(--set model.layers=2)
    "$mpiexec" -n 4 "$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted 4-rank run: $(tail -5 "$tmp/straight.txt")"
    grep -q "pipeline 2 x (fsdp=2) inside each stage (4 processes" "$tmp/straight.txt" ||
      fail "no partitioned pipeline: $(grep -A3 '== parallel' "$tmp/straight.txt")"
    grep -Eq "stage-local state: this process holds [0-9.]+ of the model's [0-9.]+ MB of parameters \(its device's shards of its stages'\)" \
      "$tmp/straight.txt" || fail "the processes do not hold shards: $(grep stage-local "$tmp/straight.txt")"
    grep -q "stage 0 forward (keeps activations)" "$tmp/straight.txt" || fail "the stages do not keep their activations"
    status=0
    TESSERA_FAULT="term@step=5,rank=1" timeout 120 "$mpiexec" -n 4 "$tessera" "${train_args[@]}" \
      --set run.dir="$tmp/stopped" >"$tmp/stopped.txt" 2>&1 || status=$?
    [[ $status -eq 0 ]] || fail "the stopped run exited $status: $(tail -8 "$tmp/stopped.txt")"
    [[ -d "$tmp/stopped/checkpoints/step_00000006" ]] || fail "no checkpoint at step 6: $(ls "$tmp/stopped/checkpoints")"
    [[ ! -d "$tmp/stopped/checkpoints/step_00000008" ]] || fail "the stopped run did not stop"
    "$tessera" ckpt verify "$tmp/stopped" >"$tmp/verify.txt" 2>&1 || fail "the stop's checkpoint: $(cat "$tmp/verify.txt")"
    "$mpiexec" -n 4 "$tessera" "${train_args[@]}" --set run.dir="$tmp/stopped" >"$tmp/resumed.txt" 2>&1 ||
      fail "the resumed run: $(tail -5 "$tmp/resumed.txt")"
    grep -Eq "steps +6 -> 8 .*resumed" "$tmp/resumed.txt" || fail "no resume from step 6: $(grep -E 'steps ' "$tmp/resumed.txt")"
    same_final_state "$tmp/straight" "$tmp/stopped" "pipeline=2,fsdp=2 stopped by one rank's SIGTERM, resumed"
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
      fail "no failed attempt for task 1's SIGKILL: $(grep -E "launch:|srun" "$tmp/launch.txt")"
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
  srun_stand_in_status)
    printf '%s\n' '#!/usr/bin/env bash' \
      'if [[ "$SLURM_PROCID" == 1 ]]; then sleep "0.0$((RANDOM % 5))"; kill -s KILL $$; fi' \
      'trap "exit 0" TERM' 'sleep "0.0$((RANDOM % 5))" & wait' >"$tmp/kill_task.sh"
    printf '%s\n' '#!/usr/bin/env bash' 'sleep "0.0$((RANDOM % 5))"' 'exit $((SLURM_PROCID + 3))' >"$tmp/exit_task.sh"
    chmod +x "$tmp/kill_task.sh" "$tmp/exit_task.sh"
    for ((run = 0; run < 300; ++run)); do
      status=0
      "$src/tests/cli/srun_stand_in/srun" -n 2 --kill-on-bad-exit "$tmp/kill_task.sh" 2>"$tmp/stand_in.txt" || status=$?
      # 137: task 1's SIGKILL; 143 when the stand-in's SIGTERM reached task 0 before its
      # shell had set its trap (a loaded machine). Anything else (the old 1) is wrong.
      [[ $status -eq 137 || $status -eq 143 ]] ||
        fail "run $run: the stand-in exited $status, expected 137 (or 143): $(cat "$tmp/stand_in.txt")"
    done
    status=0
    "$src/tests/cli/srun_stand_in/srun" -n 3 "$tmp/exit_task.sh" || status=$?
    [[ $status -eq 5 ]] || fail "tasks exiting 3, 4 and 5: the stand-in exited $status, expected 5"
    ;;
  srun_queue_wait)
    ln -s "$src/tests/cli/srun_stand_in/srun" "$tmp/bin/srun"
    ln -s "$src/tests/cli/srun_stand_in/scontrol" "$tmp/bin/scontrol"
    export PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4244
    "$tessera" launch --srun --nproc 2 --max-restarts 0 --run-dir "$tmp/job" -- bash -c 'sleep 1' >"$tmp/launch.txt" 2>&1 ||
      fail "launch exited $?: $(cat "$tmp/launch.txt")"
    grep -Eq "launch: slurm job 4244 waited 120.0 s in the queue" "$tmp/launch.txt" ||
      fail "no queue wait line: $(grep launch: "$tmp/launch.txt")"
    "$tessera" goodput "$tmp/job" --json >"$tmp/goodput.json" || fail "tessera goodput --json failed"
    python3 - "$tmp/goodput.json" <<'PY' || fail "goodput of the queued job: $(head -c 1500 "$tmp/goodput.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["has_scheduling_records"] is True, r["has_scheduling_records"]
total = r["total_s"]
assert 125 <= total <= 300, total  # 120 s queued, 5 s before the launcher, the task's 1 s
assert abs(r["scheduling_goodput"] - (total - 120) / total) < 1e-6, (r["scheduling_goodput"], total)
PY
    "$tessera" goodput "$tmp/job" >"$tmp/goodput.txt"
    grep -q "(no launcher records)" "$tmp/goodput.txt" && fail "the report still says there are no launcher records"
    # scontrol failing: the launcher says why and records nothing.
    SCONTROL_STAND_IN_FAIL=1 "$tessera" launch --srun --nproc 1 --max-restarts 0 --run-dir "$tmp/job2" -- true \
      >"$tmp/launch2.txt" 2>&1 || fail "launch with a failing scontrol exited $?: $(cat "$tmp/launch2.txt")"
    grep -q "launch: no queue wait recorded: .scontrol show job -o 4244. failed: slurm_load_jobs error: Invalid job id" \
      "$tmp/launch2.txt" || fail "no reason for the missing queue wait: $(cat "$tmp/launch2.txt")"
    ! grep -q launch_wait "$tmp/job2/goodput/events.jsonl" || fail "a queue wait was recorded without scontrol"
    ;;
  fork_stragglers | srun_stragglers)
    # The data first, so the two tasks do not both prepare it.
    "$tessera" "${train_args[@]}" --set train.steps=1 --set run.dir="$tmp/warm" >"$tmp/warm.txt" 2>&1 ||
      fail "warm-up run: $(tail -5 "$tmp/warm.txt")"
    if [[ "$case_name" == fork_stragglers ]]; then
      mode=() rank_var=TESSERA_RANK
    else
      ln -s "$src/tests/cli/srun_stand_in/srun" "$tmp/bin/srun"
      export PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4243
      mode=(--srun) rank_var=SLURM_PROCID
    fi
    printf '%s\n' '#!/usr/bin/env bash' \
      "exec $(printf '%q ' "$tessera" "${train_args[@]}") --set run.dir=\"$tmp/task\$$rank_var\"" >"$tmp/task.sh"
    chmod +x "$tmp/task.sh"
    TESSERA_FAULT="$slow_rank_1" "$tessera" launch "${mode[@]}" --nproc 2 --max-restarts 0 --run-dir "$tmp/job" -- \
      "$tmp/task.sh" >"$tmp/launch.txt" 2>&1 || fail "launch exited $?: $(tail -5 "$tmp/launch.txt")"
    [[ -d "$tmp/task1/checkpoints/step_00000008" ]] || fail "task 1 did not train in its own directory"
    check_stragglers "$tmp/job"
    ;;
  mpi_stragglers)
    [[ -n "$mpiexec" ]] || fail "no MPIEXEC argument"
    ln -s "$mpiexec" "$tmp/bin/mpirun"
    export PATH="$tmp/bin:$PATH"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMPI_MCA_rmaps_base_oversubscribe=1
    # One synchronous job: rank 0 waits for rank 1 in the gradient all-reduce, so the two
    # step times agree and only rank 1's own time (outside collectives) shows the delay.
    TESSERA_FAULT="$slow_rank_1" "$tessera" launch --mpi --nproc 2 --max-restarts 0 -- \
      "$tessera" "${train_args[@]}" --mesh data=2 --set run.dir="$tmp/launched" >"$tmp/launch.txt" 2>&1 ||
      fail "launch --mpi exited $?: $(tail -5 "$tmp/launch.txt")"
    check_stragglers "$tmp/launched"
    python3 -c "
import json, sys
r = {x['rank']: x for x in json.load(open('$tmp/goodput.json'))['stragglers']['ranks']}
assert r[0]['collective_s'] >= 1.2, r  # rank 0 waited in collectives for both delays
" || fail "rank 0's time in collectives does not show the wait: $(grep -B2 -A6 '"collective_s"' "$tmp/goodput.json" | head -20)"
    ;;
  *)
    fail "unknown case"
    ;;
esac
