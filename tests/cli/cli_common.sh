# Sourced by every tests/cli/*_test.sh: `source "$(dirname "$0")/cli_common.sh" "$@"`.
# Takes the three arguments cmake/cli_tests.cmake passes (the tessera binary, the source
# directory, the case name), makes a temporary directory removed at exit, moves to the
# source directory (configs name their files relative to the checkout), and defines fail.
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
