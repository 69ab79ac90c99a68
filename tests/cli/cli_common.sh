# Sourced by every tests/cli/*_test.sh: `source "$(dirname "$0")/cli_common.sh" "$@"`.
# Takes the three arguments cmake/cli_tests.cmake passes (the tessera binary, the source
# directory, the case name), makes a temporary directory removed at exit, moves to the
# source directory (configs name their files relative to the checkout), and defines fail
# and skip (exit 77, which cmake/cli_tests.cmake declares as SKIP_RETURN_CODE, so ctest
# counts the case as skipped, never as passed).
set -euo pipefail

tessera="$1"
src="$2"
case_name="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$src"

fail() {
  echo "FAIL ($case_name): $*" >&2
  exit 1
}

skip() {
  echo "SKIP ($case_name): $*"
  exit 77
}

# The tiny job the resilience tests train: `tiny_train_args STEPS [EXTRA...]` sets the array
# train_args (data under $tmp/data, one layer of width 64, a checkpoint every 2 steps, no
# local tier: the fault counts below are the persistent tier's saves).
tiny_train_args() {
  local steps="$1"
  shift
  train_args=(train --config configs/tiny.toml "$@"
    --set data.train="$tmp/data/train.bin" --set data.val="$tmp/data/val.bin"
    --set model.layers=1 --set model.dim=64 --set model.heads=2 --set model.context=64
    --set train.steps="$steps" --set train.batch=4 --set train.seq=64 --set train.eval_batches=1
    --set train.eval_interval=0 --set checkpoint.interval=2 --set 'checkpoint.local_dir=""' --set run.tensorboard=false)
}
