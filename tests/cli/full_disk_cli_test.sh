#!/usr/bin/env bash
# A checkpoint write the operating system really refuses (registered with ctest by
# cmake/cli_tests.cmake):
#   full_disk_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases:
#   fsize       RLIMIT_FSIZE (`ulimit -f`, SIGXFSZ ignored, so write() fails with EFBIG).
#               The limit is per file and every checkpoint has the same size, so the disk
#               "fills" between two attempts of the same command: the first (with room,
#               TESSERA_FAULT=kill@step=5) commits step 2 (and maybe 4); the second runs
#               under a limit below a checkpoint file's size (but above the goodput log's
#               and the heartbeat's), so its first save fails. It must stop (exit 1) naming
#               the step, the checkpoint path and "File too large"; the checkpoints from
#               before verify and are unchanged; a third attempt with room finishes with
#               params and optimizer state byte-identical to an uninterrupted run's.
#   fsize_sync  the same with checkpoint.async=false (the error comes from the blocking save).
#   tmpfs       RUN_DIR/checkpoints on a 1200 KiB tmpfs (needs root with CAP_SYS_ADMIN;
#               skipped with a message otherwise): step 2 (~850 KiB) fits, step 4 hits a
#               real ENOSPC ("No space left on device") in one uninterrupted command; the
#               tmpfs is then grown (remount) and the same command resumes to the end.
# Exit status 0 when the case passes, 77 when it is skipped; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"

tiny_train_args 8 --quiet
[[ "$case_name" == fsize_sync ]] && train_args+=(--set checkpoint.async=false)

# The reference (this also prepares the data, so the limited attempts write none).
"$tessera" "${train_args[@]}" --set run.dir="$tmp/straight" >"$tmp/straight.txt" 2>&1 ||
  fail "uninterrupted run: $(tail -5 "$tmp/straight.txt")"
final="$tmp/straight/checkpoints/step_00000008"
params_bytes="$(stat -c %s "$final/params.safetensors")"

# Committed checkpoints (names and file checksums): a failed save must not change them.
# Committed checkpoint directories only: a partial save (step_N.tmp-PID, left by the kill)
# also ends in a digit.
step_glob='step_[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]'
committed() { (cd "$1/checkpoints" && find . -path "./$step_glob/*" -type f | sort | xargs -r sha256sum); }

# Checks the third attempt's outcome: it resumed with room and matches the reference.
check_resumed_to_the_end() {
  local run="$1"
  "$tessera" "${train_args[@]}" --set run.dir="$run" >"$tmp/resume.txt" 2>&1 ||
    fail "resume with room: $(tail -5 "$tmp/resume.txt")"
  for f in params.safetensors opt_state.safetensors; do
    cmp -s "$final/$f" "$run/checkpoints/step_00000008/$f" ||
      fail "$f after the failed save and the resume differs from the uninterrupted run's"
  done
  "$tessera" ckpt verify "$run" >"$tmp/verify_end.txt" 2>&1 || fail "after the resume: $(cat "$tmp/verify_end.txt")"
}

case "$case_name" in
  fsize | fsize_sync)
    status=0
    TESSERA_FAULT="kill@step=5" "$tessera" "${train_args[@]}" --set run.dir="$tmp/run" >"$tmp/first.txt" 2>&1 ||
      status=$?
    [[ $status -eq 137 ]] || fail "the first attempt exited with $status, expected 137: $(tail -5 "$tmp/first.txt")"
    before="$(committed "$tmp/run")"
    newest="$(ls -d "$tmp"/run/checkpoints/$step_glob | tail -1)"
    [[ -n "$before" && -n "$newest" ]] || fail "no committed checkpoint after the first attempt"
    newest_step=$((10#${newest##*step_}))
    # ulimit -f counts KiB; half a params file is far above the goodput log (~6 KiB).
    limit_kib=$((params_bytes / 2048))
    status=0
    (
      ulimit -f "$limit_kib"
      trap '' XFSZ  # ignored: write() returns EFBIG instead of the signal killing the process
      TESSERA_FAULT="kill@step=5" exec "$tessera" "${train_args[@]}" --set run.dir="$tmp/run"
    ) >"$tmp/limited.txt" 2>&1 || status=$?
    [[ $status -eq 1 ]] || fail "under ulimit -f $limit_kib the run exited $status, expected 1: $(tail -5 "$tmp/limited.txt")"
    failed_step=$((newest_step + 2))
    pattern="checkpoint save of step $failed_step to $tmp/run/checkpoints failed.*: cannot write $tmp/run/checkpoints/step_$(printf %08d $failed_step)\.tmp-[0-9]*/[a-z_]*\.safetensors: File too large"
    grep -q "$pattern" "$tmp/limited.txt" || fail "no clear EFBIG error; got: $(tail -3 "$tmp/limited.txt")"
    [[ "$(committed "$tmp/run")" == "$before" ]] || fail "the committed checkpoints changed in the failed attempt"
    [[ -z "$(ls -d "$tmp"/run/checkpoints/*.tmp-* 2>/dev/null)" ]] || echo "note: the failed save left a partial directory"
    "$tessera" ckpt verify "$tmp/run" >"$tmp/verify.txt" 2>&1 || fail "after the failed save: $(cat "$tmp/verify.txt")"
    check_resumed_to_the_end "$tmp/run"
    echo "fsize: ulimit -f $limit_kib KiB; save of step $failed_step refused (EFBIG); resumed from step $newest_step"
    ;;
  tmpfs)
    mkdir -p "$tmp/run/checkpoints"
    if ! mount -t tmpfs -o size=1200k tmpfs "$tmp/run/checkpoints" 2>"$tmp/mount.txt"; then
      skip "cannot mount a tmpfs (needs root with CAP_SYS_ADMIN): $(cat "$tmp/mount.txt")"
    fi
    trap 'umount "$tmp/run/checkpoints" 2>/dev/null; rm -rf "$tmp"' EXIT
    status=0
    "$tessera" "${train_args[@]}" --set run.dir="$tmp/run" >"$tmp/full.txt" 2>&1 || status=$?
    [[ $status -eq 1 ]] || fail "on a full tmpfs the run exited $status, expected 1: $(tail -5 "$tmp/full.txt")"
    pattern="checkpoint save of step 4 to $tmp/run/checkpoints failed.*: cannot write $tmp/run/checkpoints/step_00000004\.tmp-[0-9]*/[a-z_]*\.safetensors: No space left on device"
    grep -q "$pattern" "$tmp/full.txt" || fail "no clear ENOSPC error; got: $(tail -3 "$tmp/full.txt")"
    committed_dirs=("$tmp"/run/checkpoints/$step_glob)
    [[ ${#committed_dirs[@]} -eq 1 && "${committed_dirs[0]}" == */step_00000002 ]] ||
      fail "committed checkpoints after ENOSPC: $(ls "$tmp/run/checkpoints")"
    "$tessera" ckpt verify "$tmp/run" >"$tmp/verify.txt" 2>&1 || fail "after ENOSPC: $(cat "$tmp/verify.txt")"
    mount -o remount,size=16m "$tmp/run/checkpoints" || fail "cannot grow the tmpfs"
    check_resumed_to_the_end "$tmp/run"
    echo "tmpfs: save of step 4 refused (ENOSPC) on a 1200 KiB tmpfs; resumed from step 2"
    ;;
  *)
    fail "unknown case"
    ;;
esac
