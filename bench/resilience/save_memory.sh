#!/usr/bin/env bash
# Host memory of checkpoint saves in a real training run: the peak RSS of the same short
# `small`-preset run with asynchronous and with synchronous saves (a save every 4 steps,
# no local tier), and the size of one checkpoint. An async save adds one staging copy of
# the state (allocated at the first save, reused); a sync save streams from the arrays.
#
#   bench/resilience/save_memory.sh [TESSERA] [OUT_DIR]      (from the repository root)
set -euo pipefail
tessera="${1:-build/bin/tessera}"
out="${2:-runs/save-memory}"
rm -rf "$out"
mkdir -p "$out"
peak_mib() {  # peak_mib ASYNC: runs the training, prints the child's peak RSS in MiB
  python3 - "$tessera" train --config configs/tiny.toml --set model.preset=small \
    --set data.train="$out/data/train.bin" --set data.val="$out/data/val.bin" \
    --set train.steps=12 --set train.batch=4 --set train.seq=128 --set train.eval_batches=1 \
    --set checkpoint.interval=4 --set 'checkpoint.local_dir=""' --set checkpoint.async="$1" \
    --set run.dir="$out/async-$1" --quiet <<'PY'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f}")
PY
}
async_mib="$(peak_mib true)"
sync_mib="$(peak_mib false)"
state_mib="$(du -sm "$out/async-true/checkpoints/step_00000012" | cut -f1)"
echo "peak RSS: async saves ${async_mib} MiB, sync saves ${sync_mib} MiB; one checkpoint ${state_mib} MiB"
echo "{\"async_peak_mib\":$async_mib,\"sync_peak_mib\":$sync_mib,\"checkpoint_mib\":$state_mib,\"async_extra_mib\":$((async_mib - sync_mib))}"
