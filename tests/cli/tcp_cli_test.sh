#!/usr/bin/env bash
# TCP jobs: `tessera launch --coordinator HOST:PORT` without MPI (the pods of a Kubernetes
# Job, hosts started by hand), registered with ctest by cmake/cli_tests.cmake:
#   tcp_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases:
#   one_host      `launch --nproc 2 --coordinator 127.0.0.1:0` of a `--mesh data=2` run
#                 equals the same mesh in one process (2 virtual devices) bit for bit: every
#                 step's loss, the final params and optimizer state
#   two_nodes     two launchers, as two hosts would run them (--nnodes 2, --node-rank 0 and
#                 1, 2 ranks each, `--mesh data=2,fsdp=2`) against 4 virtual devices in one
#                 process: bit for bit; node 1's launcher logs its attempts under
#                 RUN_DIR/nodes/node-1, node 0 writes the job's log
#   kill_restart  the same two launchers with rank 3 (on node 1) SIGKILLed at step 5
#                 (TESSERA_FAULT): node 0's workers fail in a collective that names the lost
#                 rank and its launcher restarts them, node 1's restarts its own, the ranks
#                 meet again at the coordinator and finish byte-identical to the one-process
#                 run
#   test_hosts    two launchers on two test hosts (tools/testbed.sh: network namespaces with
#                 their own addresses; the coordinator is tbh1's name): bit for bit against
#                 one process. Skips without root and network namespaces.
#   errors        --nnodes without --coordinator, a node rank out of range, a malformed
#                 coordinator, --coordinator with --mpi, a --mesh of another size, --nproc
#                 that does not divide: exit 2, a message naming what was wrong, no job
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"

devices=2
if [[ "$case_name" == two_nodes || "$case_name" == kill_restart ]]; then
  tiny_train_args 8 --quiet --mesh data=2,fsdp=2
  devices=4
else
  tiny_train_args 8 --quiet --mesh data=2
fi

one_process_run() {
  TESSERA_CPU_DEVICES=$devices "$tessera" "${train_args[@]}" --set run.dir="$tmp/one" >"$tmp/one.txt" 2>&1 ||
    fail "the one-process run: $(tail -5 "$tmp/one.txt")"
}
same_as_one_process() {  # run dir, what
  diff <(grep -o '"loss":[^,]*' "$tmp/one/metrics.jsonl") <(grep -o '"loss":[^,]*' "$1/metrics.jsonl") ||
    fail "$2: the losses differ from the one-process run's"
  [[ "$(grep -c '"loss"' "$1/metrics.jsonl")" -ge 1 ]] || fail "$2: no losses logged"
  for f in params.safetensors opt_state.safetensors; do
    cmp -s "$tmp/one/checkpoints/step_00000008/$f" "$1/checkpoints/step_00000008/$f" ||
      fail "$2: $f differs from the one-process run's"
  done
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# Two launchers as two hosts run them: NODE0_LOG NODE1_LOG RUN_DIR [launch options...];
# fails unless both exit 0.
two_launchers() {
  local log0="$1" log1="$2" run_dir="$3"
  shift 3
  local port
  port="$(free_port)"
  local common=(launch --nnodes 2 --nproc-per-host 2 --coordinator "127.0.0.1:$port" --backoff 0 "$@")
  "$tessera" "${common[@]}" --node-rank 1 -- "$tessera" "${train_args[@]}" --set run.dir="$run_dir" >"$log1" 2>&1 &
  local node1=$!
  local status0=0 status1=0
  "$tessera" "${common[@]}" --node-rank 0 -- "$tessera" "${train_args[@]}" --set run.dir="$run_dir" >"$log0" 2>&1 ||
    status0=$?
  wait $node1 || status1=$?
  [[ $status0 -eq 0 && $status1 -eq 0 ]] ||
    fail "launchers exited $status0 and $status1: node 0: $(tail -6 "$log0"); node 1: $(tail -6 "$log1")"
}

case "$case_name" in
  one_host)
    one_process_run
    "$tessera" launch --nproc 2 --coordinator 127.0.0.1:0 --max-restarts 0 -- \
      "$tessera" "${train_args[@]}" --set run.dir="$tmp/tcp" >"$tmp/tcp.txt" 2>&1 ||
      fail "launch --coordinator: $(tail -8 "$tmp/tcp.txt")"
    grep -Eq "started ranks 0\.\.1 of 2 \(host 0 of 1, coordinator 127\.0\.0\.1:[0-9]+\)" "$tmp/tcp.txt" ||
      fail "no start line: $(grep launch: "$tmp/tcp.txt")"
    grep -q "mesh (data=2) (tcp (rank 0 of 2))" "$tmp/tcp.txt" || fail "not one TCP job of 2 ranks: $(cat "$tmp/tcp.txt")"
    same_as_one_process "$tmp/tcp" "2 ranks over TCP"
    ;;
  two_nodes)
    one_process_run
    two_launchers "$tmp/node0.txt" "$tmp/node1.txt" "$tmp/tcp" --max-restarts 0
    grep -q "started ranks 0\.\.1 of 4 (host 0 of 2" "$tmp/node0.txt" || fail "node 0: $(grep launch: "$tmp/node0.txt")"
    grep -q "started ranks 2\.\.3 of 4 (host 1 of 2" "$tmp/node1.txt" || fail "node 1: $(grep launch: "$tmp/node1.txt")"
    grep -q "mesh (data=2, fsdp=2) (tcp (rank 0 of 4))" "$tmp/node0.txt" || fail "not one TCP job of 4 ranks"
    same_as_one_process "$tmp/tcp" "2 nodes x 2 ranks over TCP"
    [[ -f "$tmp/tcp/nodes/node-1/goodput/events.jsonl" ]] || fail "node 1's launcher log is missing"
    [[ "$(grep -c '"type":"job_start"' "$tmp/tcp/goodput/events.jsonl")" -eq 1 ]] || fail "the job log has no single job_start"
    ;;
  kill_restart)
    one_process_run
    # Rank 3 (node 1's second worker) is killed. A long hang timeout: the kill must end the
    # attempt through the lost connection, not through the hang detector, which a loaded
    # machine could trip first.
    TESSERA_FAULT="kill@step=5,rank=3" two_launchers "$tmp/node0.txt" "$tmp/node1.txt" "$tmp/tcp" \
      --max-restarts 2 --hang-timeout 60
    grep -q "attempt 0 failed after .*: rank 3 killed by SIGKILL" "$tmp/node1.txt" ||
      fail "node 1 did not see rank 3's SIGKILL: $(grep launch: "$tmp/node1.txt")"
    grep -Eq "attempt 0 failed after .*: rank [01] exit" "$tmp/node0.txt" ||
      fail "node 0's workers did not fail on the lost rank: $(grep launch: "$tmp/node0.txt")"
    grep -q "rank 3 closed its connection" "$tmp/node0.txt" || fail "node 0's ranks did not name the lost rank"
    for log in "$tmp/node0.txt" "$tmp/node1.txt"; do
      grep -q "succeeded after 2 attempt(s) (1 restart(s)); exit 0" "$log" || fail "no summary line: $(grep launch: "$log")"
    done
    [[ -n "$(ls "$tmp"/tcp/.fault_fired.*rank3 2>/dev/null)" ]] || fail "the fault did not fire on rank 3"
    same_as_one_process "$tmp/tcp" "2 nodes after the kill and the restart"
    ;;
  test_hosts)
    testbed="$src/tools/testbed.sh"
    reason="$("$testbed" check 2>&1)" || skip "no test hosts here: $reason"
    trap '"$testbed" down; rm -rf "$tmp"' EXIT
    "$testbed" up 2
    one_process_run
    common=(launch --nnodes 2 --coordinator tbh1:29500 --max-restarts 0)
    "$testbed" exec tbh2 "$tessera" "${common[@]}" --node-rank 1 -- "$tessera" "${train_args[@]}" \
      --set run.dir="$tmp/tcp" >"$tmp/node1.txt" 2>&1 &
    node1=$!
    status0=0 status1=0
    "$testbed" exec tbh1 "$tessera" "${common[@]}" --node-rank 0 -- "$tessera" "${train_args[@]}" \
      --set run.dir="$tmp/tcp" >"$tmp/node0.txt" 2>&1 || status0=$?
    wait $node1 || status1=$?
    [[ $status0 -eq 0 && $status1 -eq 0 ]] ||
      fail "launchers exited $status0 and $status1: $(tail -6 "$tmp/node0.txt"); $(tail -6 "$tmp/node1.txt")"
    grep -q "mesh (data=2) (tcp (rank 0 of 2))" "$tmp/node0.txt" || fail "not one TCP job of 2 ranks"
    same_as_one_process "$tmp/tcp" "2 test hosts over TCP"
    ;;
  errors)
    expect_usage_error() {  # WHAT PATTERN launch-options...
      local what="$1" pattern="$2"
      shift 2
      local status=0
      "$tessera" launch "$@" -- "$tessera" "${train_args[@]}" --set run.dir="$tmp/bad" >"$tmp/err.txt" 2>&1 ||
        status=$?
      [[ $status -eq 2 ]] || fail "$what: launch exited $status, expected 2: $(cat "$tmp/err.txt")"
      grep -q -- "$pattern" "$tmp/err.txt" || fail "$what: no '$pattern' in: $(cat "$tmp/err.txt")"
      [[ ! -e "$tmp/bad/goodput" ]] || fail "$what: the job started"
    }
    expect_usage_error "--nnodes alone" "--nnodes and --node-rank need --coordinator HOST:PORT" --nnodes 2
    expect_usage_error "node rank too large" "--node-rank 2 with --nnodes 2: expected 0 <= node rank < nnodes" \
      --nnodes 2 --node-rank 2 --coordinator 127.0.0.1:29500
    expect_usage_error "no port" "--coordinator 'pod-0.job': expected HOST:PORT" --coordinator pod-0.job
    expect_usage_error "port 0 on two hosts" "the port '0' is not a number from 1 to 65535" \
      --coordinator pod-0.job:0 --nnodes 2
    expect_usage_error "with --mpi" "--coordinator starts a TCP job itself; it excludes --mpi and --srun" \
      --coordinator 127.0.0.1:0 --mpi
    expect_usage_error "mesh of 2, 4 ranks" \
      "the command's --mesh has 2 devices, but --nnodes x --nproc-per-host starts 4 ranks" \
      --coordinator 127.0.0.1:29500 --nnodes 2 --nproc-per-host 2
    expect_usage_error "--nproc does not divide" "--nproc 3 does not divide into --nnodes 2 hosts" \
      --coordinator 127.0.0.1:29500 --nnodes 2 --nproc 3
    ;;
  *)
    fail "unknown case"
    ;;
esac
