#!/bin/bash
# A longer fuzzing run than `make test`'s (docs/fuzzing.md): each named target for its
# seconds, one after another, niced, with the caps of the ctests. Prints one line per
# target: executions and libFuzzer's final coverage (cov: edges, ft: features).
#   fuzz/campaign.sh OUT_DIR target:seconds...
# OUT_DIR/<target>.log holds the whole log, OUT_DIR/corpus/<target>/ what the run found
# (the committed seeds stay read-only), OUT_DIR/<target>-crash-* a failing input.
set -u
out=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FUZZ_BIN:-$root/build-fuzz/bin}
mkdir -p "$out"
for spec in "$@"; do
  target=${spec%%:*}
  seconds=${spec#*:}
  mkdir -p "$out/corpus/$target"
  nice -n 10 "$bin/fuzz_$target" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$out/$target-" "$out/corpus/$target" "$root/fuzz/corpus/$target" \
    >"$out/$target.log" 2>&1
  rc=$?
  execs=$(grep -a 'stat::number_of_executed_units' "$out/$target.log" | awk '{print $2}')
  cov=$(grep -a -oE 'cov: [0-9]+ ft: [0-9]+' "$out/$target.log" | tail -1)
  echo "$target rc=$rc seconds=$seconds execs=${execs:-?} $cov"
done
