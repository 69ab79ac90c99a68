#!/usr/bin/env bash
# `tessera launch --hosts` across test hosts (tools/testbed.sh: network namespaces with
# their own addresses and hostnames, so MPI talks TCP between distinct nodes), registered
# with ctest by cmake/cli_tests.cmake under the label multihost:
#   multihost_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE MPIEXEC
# Cases:
#   two_hosts     a `--mesh data=2` run with one rank on each of 2 hosts equals the same
#                 mesh in one process (2 virtual devices) bit for bit: every step's loss,
#                 the final params and optimizer state; each rank ran on its own host
#   two_per_host  the same with 2 ranks on each host and a 2-D mesh (data=2, fsdp=2) against
#                 4 virtual devices in one process: FSDP's gathers and reduce-scatters
#                 cross the hosts too
#   kill_restart  rank 1 (on the second host) is SIGKILLed at step 5 (TESSERA_FAULT, passed
#                 to the remote rank with mpirun -x); the launcher restarts the job on both
#                 hosts from the last checkpoint and the final state is byte-identical to
#                 the one-process run
#   errors        an unknown host, a host list whose rank count disagrees with --mesh or
#                 --nproc, a repeated host, --hosts with --srun: exit 2 and a message that
#                 names what was wrong, before anything starts
# Needs root and network namespaces (tools/testbed.sh check); skips with the reason when
# they are missing.
source "$(dirname "$0")/cli_common.sh" "$@"
mpiexec="${4:-}"
[[ -n "$mpiexec" ]] || fail "no MPIEXEC argument"

testbed="$src/tools/testbed.sh"
reason="$("$testbed" check 2>&1)" || skip "no test hosts here: $reason"
trap '"$testbed" down; rm -rf "$tmp"' EXIT
"$testbed" up 2

mkdir -p "$tmp/bin"
ln -s "$mpiexec" "$tmp/bin/mpirun"
export PATH="$tmp/bin:$PATH"
# As root, in a container, on 2 cores (see cmake/mpi_tests.cmake).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# The ranks' processes print their host into their log through this wrapper.
printf '%s\n' '#!/usr/bin/env bash' 'echo "rank ${OMPI_COMM_WORLD_RANK:-?} on $(hostname)" >>"$TESSERA_TEST_HOST_LOG"' \
  'exec "$@"' >"$tmp/on_host.sh"
chmod +x "$tmp/on_host.sh"
export TESSERA_TEST_HOST_LOG="$tmp/hosts.txt"

devices=2
per_host=1
if [[ "$case_name" == two_per_host ]]; then
  tiny_train_args 8 --quiet --mesh data=2,fsdp=2
  devices=4
  per_host=2
else
  tiny_train_args 8 --quiet --mesh data=2
fi
launch_on_hosts() {  # RUN_DIR LOG [launch options...]: launch from the first host, a rank on each
  local run_dir="$1" log="$2"
  shift 2
  "$testbed" exec tbh1 "$tessera" launch --hosts tbh1,tbh2 --nproc-per-host $per_host --launch-agent "$testbed agent" \
    --backoff 0 "$@" -- \
    "$tmp/on_host.sh" "$tessera" "${train_args[@]}" --set run.dir="$run_dir" >"$log" 2>&1
}
one_process_run() {
  TESSERA_CPU_DEVICES=$devices "$tessera" "${train_args[@]}" --set run.dir="$tmp/one" >"$tmp/one.txt" 2>&1 ||
    fail "the one-process run: $(tail -5 "$tmp/one.txt")"
}
same_final_state() {  # run dir, what
  for f in params.safetensors opt_state.safetensors; do
    cmp -s "$tmp/one/checkpoints/step_00000008/$f" "$1/checkpoints/step_00000008/$f" ||
      fail "$2: $f differs from the one-process run's"
  done
}

case "$case_name" in
  two_hosts)
    one_process_run
    launch_on_hosts "$tmp/two" "$tmp/two.txt" --max-restarts 0 || fail "launch on 2 hosts: $(tail -8 "$tmp/two.txt")"
    grep -q "started 2 ranks on 2 hosts (tbh1, tbh2)" "$tmp/two.txt" || fail "no start line: $(grep launch: "$tmp/two.txt")"
    grep -q "mesh (data=2) (mpi (rank 0 of 2))" "$tmp/two.txt" || fail "not one MPI job of 2 ranks: $(cat "$tmp/two.txt")"
    [[ "$(sort "$tmp/hosts.txt" | tr '\n' ' ')" == "rank 0 on tbh1 rank 1 on tbh2 " ]] ||
      fail "ranks ran on: $(cat "$tmp/hosts.txt")"
    # Every step's loss, bit for bit (the JSON holds each float's shortest round trip).
    diff <(grep -o '"loss":[^,]*' "$tmp/one/metrics.jsonl") <(grep -o '"loss":[^,]*' "$tmp/two/metrics.jsonl") ||
      fail "the losses differ from the one-process run's"
    [[ "$(grep -c '"loss"' "$tmp/two/metrics.jsonl")" -ge 1 ]] || fail "no losses logged"
    same_final_state "$tmp/two" "2 hosts"
    ;;
  two_per_host)
    one_process_run
    launch_on_hosts "$tmp/two" "$tmp/two.txt" --max-restarts 0 || fail "launch on 2 hosts: $(tail -8 "$tmp/two.txt")"
    grep -q "started 4 ranks on 2 hosts (tbh1, tbh2)" "$tmp/two.txt" || fail "no start line: $(grep launch: "$tmp/two.txt")"
    grep -q "mesh (data=2, fsdp=2) (mpi (rank 0 of 4))" "$tmp/two.txt" || fail "not one MPI job of 4 ranks: $(cat "$tmp/two.txt")"
    [[ "$(grep -c "on tbh1" "$tmp/hosts.txt") $(grep -c "on tbh2" "$tmp/hosts.txt")" == "2 2" ]] ||
      fail "ranks ran on: $(cat "$tmp/hosts.txt")"
    diff <(grep -o '"loss":[^,]*' "$tmp/one/metrics.jsonl") <(grep -o '"loss":[^,]*' "$tmp/two/metrics.jsonl") ||
      fail "the losses differ from the one-process run's"
    same_final_state "$tmp/two" "2 hosts, 2 ranks each"
    ;;
  kill_restart)
    one_process_run
    status=0
    # A long hang timeout: the kill must end the job through mpirun (the remote daemon sees
    # its rank die), not through the hang detector, which a loaded machine could trip first.
    TESSERA_FAULT="kill@step=5,rank=1" launch_on_hosts "$tmp/two" "$tmp/two.txt" --max-restarts 2 --hang-timeout 60 ||
      status=$?
    [[ $status -eq 0 ]] || fail "launch exited $status: $(tail -8 "$tmp/two.txt")"
    grep -q "attempt 0 failed after .*: mpirun exit" "$tmp/two.txt" ||
      fail "no failed attempt for rank 1's SIGKILL: $(grep launch: "$tmp/two.txt")"
    grep -q "succeeded after 2 attempt(s) (1 restart(s)); exit 0" "$tmp/two.txt" ||
      fail "no summary line: $(grep launch: "$tmp/two.txt")"
    [[ -n "$(ls "$tmp"/two/.fault_fired.*rank1 2>/dev/null)" ]] || fail "the fault did not fire on rank 1"
    [[ "$(grep -c "rank 1 on tbh2" "$tmp/hosts.txt")" -eq 2 ]] || fail "rank 1 did not run twice on tbh2: $(cat "$tmp/hosts.txt")"
    same_final_state "$tmp/two" "2 hosts after the kill and the restart"
    ;;
  errors)
    expect_usage_error() {  # WHAT PATTERN launch-options...
      local what="$1" pattern="$2"
      shift 2
      local status=0
      "$testbed" exec tbh1 "$tessera" launch "$@" -- "$tessera" "${train_args[@]}" --set run.dir="$tmp/bad" \
        >"$tmp/err.txt" 2>&1 || status=$?
      [[ $status -eq 2 ]] || fail "$what: launch exited $status, expected 2: $(cat "$tmp/err.txt")"
      grep -q -- "$pattern" "$tmp/err.txt" || fail "$what: no '$pattern' in: $(cat "$tmp/err.txt")"
      [[ ! -e "$tmp/bad/goodput" ]] || fail "$what: the job started"
    }
    expect_usage_error "unknown host" "unknown host 'tbh9' in --hosts (entry 2)" --hosts tbh1,tbh9
    expect_usage_error "mesh of 2, 3 hosts" "the command's --mesh has 2 devices, but --hosts starts 3 ranks" \
      --hosts tbh1,tbh2,tbh1 --launch-agent "$testbed agent"
    expect_usage_error "mesh of 2, 4 ranks" "the command's --mesh has 2 devices, but --hosts starts 4 ranks" \
      --hosts tbh1,tbh2 --nproc-per-host 2
    expect_usage_error "--nproc disagrees" "--nproc 3 disagrees with --hosts tbh1,tbh2 x --nproc-per-host 1 = 2 ranks" \
      --hosts tbh1,tbh2 --nproc 3
    expect_usage_error "a host twice" "host 'tbh1' appears twice in --hosts" --hosts tbh1,tbh1
    expect_usage_error "an empty entry" "--hosts entry 2 '' is not a host name" --hosts tbh1,
    expect_usage_error "--srun" "--hosts and --srun exclude each other" --hosts tbh1,tbh2 --srun
    expect_usage_error "agent alone" "--nproc-per-host and --launch-agent need --hosts" --launch-agent ssh --nproc 2
    ;;
  *)
    fail "unknown case"
    ;;
esac
