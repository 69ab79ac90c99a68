#!/usr/bin/env bash
# Regenerates one oracle's golden file and checks it against the committed one.
#
#   tests/oracles/run_oracle.sh jax_core            # regenerate, diff against goldens/jax_core.json
#   tests/oracles/run_oracle.sh jax_core --update   # ... and overwrite the golden when it differs
#
# The oracle's pinned packages (requirements-<package>.txt, package = the name up
# to the first '_') go into a venv cached in .venv-oracles/ (gitignored); it is
# rebuilt when the requirements file changes. CI never runs this: the C++ tests
# read the committed goldens. Exit status: 0 match (or first golden written),
# 1 the regenerated golden differs from the committed one, 2 usage/setup error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
name="${1:-}"
update="${2:-}"
if [[ -z "$name" || ! -f "$here/$name.py" ]]; then
  echo "usage: $0 ORACLE [--update]   (oracles: $(cd "$here" && ls *.py | grep -v compare_goldens | sed 's/\.py$//' | tr '\n' ' '))" >&2
  exit 2
fi
reqs="$here/requirements-${name%%_*}.txt"
[[ -f "$reqs" ]] || { echo "$0: $reqs not found" >&2; exit 2; }

venv="$root/.venv-oracles"
stamp="$venv/.installed-$(basename "$reqs")"
python="${PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "[oracle] creating $venv with $("$python" --version)"
  "$python" -m venv "$venv"
fi
if [[ ! -f "$stamp" ]] || ! cmp -s "$reqs" "$stamp"; then
  echo "[oracle] installing $(grep -v '^#' "$reqs" | tr '\n' ' ')"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$stamp"
fi

golden="$here/goldens/$name.json"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[oracle] running $name.py"
JAX_PLATFORMS=cpu "$venv/bin/python" "$here/$name.py" "$tmp/$name.json"

mkdir -p "$here/goldens"
if [[ ! -f "$golden" ]]; then
  cp "$tmp/$name.json" "$golden"
  echo "[oracle] no golden yet: wrote $golden ($(du -h "$golden" | cut -f1)); review and commit it"
  exit 0
fi
echo "[oracle] live comparison against ${golden#"$root"/}"
if "$venv/bin/python" "$here/compare_goldens.py" "$tmp/$name.json" "$golden" --tol 1e-12; then
  exit 0
fi
if [[ "$update" == "--update" ]]; then
  cp "$tmp/$name.json" "$golden"
  echo "[oracle] --update: overwrote $golden; review the diff and commit it"
  exit 0
fi
echo "[oracle] the committed golden is stale or the oracle changed; rerun with --update to overwrite it"
exit 1
