#!/usr/bin/env bash
# `tessera launch` end to end (registered with ctest by cmake/cli_tests.cmake):
#   launch_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases:
#   kill_resume  a tiny byte-level training run under `tessera launch --max-restarts 3`
#                whose worker this script SIGKILLs once it heartbeats step >= 2: the
#                supervisor restarts it, it resumes from its last checkpoint, and the
#                final params file is byte-identical to an uninterrupted run's; the
#                goodput log has both attempts and the reason
#   exit_codes   a worker's exit 2 (usage error) is passed through without a restart; a
#                spent budget exits 75; no run directory is a usage error
#   verbatim_command
#                the worker gets its arguments exactly as given after `--`: "[a,b]",
#                "k=[1,2]", "x,y", "--" (CLI11 once split list-looking values)
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"

train_args=(train --config configs/tiny.toml --quiet
  --set data.train="$tmp/data/train.bin" --set data.val="$tmp/data/val.bin"
  --set model.layers=1 --set model.dim=128 --set model.heads=2 --set model.context=128
  --set train.steps=200 --set train.batch=8 --set train.seq=128 --set train.eval_batches=1
  --set train.eval_interval=0 --set checkpoint.interval=20 --set run.tensorboard=false)

case "$case_name" in
  kill_resume)
    "$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
      fail "uninterrupted run: $(tail -5 "$tmp/straight.txt")"
    "$tessera" launch --nproc 1 --max-restarts 3 --backoff 0 --heartbeat-dir "$tmp/beats" -- \
      "$tessera" "${train_args[@]}" --set run.dir="$tmp/launched" >"$tmp/launch.txt" 2>&1 &
    launcher=$!
    killed=""
    for _ in $(seq 1 600); do  # up to 60 s for step 2
      beat="$(cat "$tmp/beats/rank-0.json" 2>/dev/null || true)"
      step="$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' <<<"$beat")"
      if [[ -n "$step" && "$step" -ge 2 ]]; then
        pid="$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' <<<"$beat")"
        kill -KILL "$pid" && killed="$step"
        break
      fi
      kill -0 "$launcher" 2>/dev/null || break
      sleep 0.1
    done
    status=0
    wait "$launcher" || status=$?
    [[ -n "$killed" ]] || fail "never saw a heartbeat at step >= 2: $(tail -5 "$tmp/launch.txt")"
    [[ $status -eq 0 ]] || fail "launch exited $status: $(tail -5 "$tmp/launch.txt")"
    grep -q "attempt 0 failed after .*: rank 0 killed by SIGKILL at step" "$tmp/launch.txt" ||
      fail "no attempt line for the kill: $(cat "$tmp/launch.txt")"
    grep -q "succeeded after 2 attempt(s) (1 restart(s)); exit 0" "$tmp/launch.txt" ||
      fail "no summary line: $(tail -3 "$tmp/launch.txt")"
    a="$(ls -d "$tmp"/straight/checkpoints/step_* | tail -1)"
    b="$(ls -d "$tmp"/launched/checkpoints/step_* | tail -1)"
    [[ "$(basename "$a")" == step_00000200 && "$(basename "$b")" == step_00000200 ]] || fail "last checkpoints $a, $b"
    cmp -s "$a/params.safetensors" "$b/params.safetensors" ||
      fail "params after the kill and resume differ from the uninterrupted run's"
    log="$tmp/launched/goodput/events.jsonl"
    [[ "$(grep -c '"type":"attempt_start"' "$log")" -eq 2 ]] || fail "attempt_start lines: $(grep attempt_start "$log")"
    grep '"type":"attempt_start"' "$log" | tail -1 | grep -q "rank 0 killed by SIGKILL" ||
      fail "the restart's reason: $(grep attempt_start "$log" | tail -1)"
    [[ "$(grep -c '"type":"job_start"' "$log")" -eq 1 ]] || fail "job_start lines"
    grep '"type":"job_end"' "$log" | tail -1 | grep -q '"status":"ok"' || fail "no successful job_end"
    "$tessera" goodput "$tmp/launched" >"$tmp/goodput.txt" 2>&1 || fail "goodput report: $(cat "$tmp/goodput.txt")"
    ;;
  exit_codes)
    status=0
    "$tessera" launch --run-dir "$tmp/r1" --max-restarts 3 --backoff 0 -- bash -c 'exit 2' >"$tmp/o1.txt" 2>&1 ||
      status=$?
    [[ $status -eq 2 ]] || fail "exit 2 worker: launch exited $status"
    [[ "$(grep -c '"type":"attempt_start"' "$tmp/r1/goodput/events.jsonl")" -eq 1 ]] || fail "exit 2 was retried"
    status=0
    "$tessera" launch --run-dir "$tmp/r2" --max-restarts 1 --backoff 0 -- bash -c 'exit 1' >"$tmp/o2.txt" 2>&1 ||
      status=$?
    [[ $status -eq 75 ]] || fail "spent budget: launch exited $status"
    grep -q "no restarts left (--max-restarts 1)" "$tmp/o2.txt" || fail "budget line: $(cat "$tmp/o2.txt")"
    # A config error in `tessera train` exits 2: launch stops at once, no restart.
    printf '[train]\nsteps = -3\n' >"$tmp/bad.toml"
    status=0
    "$tessera" launch --run-dir "$tmp/r4" --max-restarts 3 --backoff 0 -- tessera train --config "$tmp/bad.toml" \
      >"$tmp/o4.txt" 2>&1 || status=$?
    [[ $status -eq 2 ]] || fail "config error: launch exited $status: $(cat "$tmp/o4.txt")"
    [[ "$(grep -c '"type":"attempt_start"' "$tmp/r4/goodput/events.jsonl")" -eq 1 ]] || fail "a config error was retried"
    status=0
    "$tessera" launch -- bash -c 'exit 0' >"$tmp/o3.txt" 2>&1 || status=$?
    [[ $status -eq 2 ]] || fail "no run dir: launch exited $status"
    grep -q -- "--run-dir" "$tmp/o3.txt" || fail "no-run-dir message: $(cat "$tmp/o3.txt")"
    ;;
  verbatim_command)
    "$tessera" launch --run-dir "$tmp/v" -- printf '%s|' "[a,b]" "--set" "k=[1,2]" "x,y" "[z]" "--" "" \
      >"$tmp/v.txt" 2>"$tmp/v.err" || fail "launch exited $?: $(cat "$tmp/v.err")"
    [[ "$(cat "$tmp/v.txt")" == '[a,b]|--set|k=[1,2]|x,y|[z]|--||' ]] || fail "the worker got: $(cat "$tmp/v.txt")"
    ;;
  *)
    fail "unknown case"
    ;;
esac
