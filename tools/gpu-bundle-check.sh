#!/usr/bin/env bash
# The prepared GPU acceptance call (issue 20's protocol): one command on a lent GPU machine
# that runs tools/gpu-bundle.sh's phases in order of importance, each under its own time
# limit, and brings every log back as one archive (a device call returns at most 8 files).
#
#   here:   tools/gpu-bundle.sh make
#           tools/gpu-bundle-check.sh                 # rehearsal: every phase fails fast, no GPU
#   there:  tools/gpu-bundle-check.sh                 # with .gpucarry/bundle.tar.xz carried
#
# Phases, in this order (GPT-2 124M, bf16, batch 16 x 1024 unless named):
#   device       nvidia-smi, libraries, torch / cuDNN / jax versions
#   test         test_cuda, every test
#   spmd         test_cuda's *GpuSpmd* tests on 8 virtual devices of the GPU
#                (TESSERA_GPU_VIRTUAL_DEVICES=8): the collectives bitwise the CPU's, GPT
#                steps under data/fsdp/tensor layouts against the CPU's sharded run
#   bench        tessera, then PyTorch (torch.compile) in the same process: vs_best_peer
#   profile      per-kernel GPU profile of 3 steps (TESSERA_PROFILE=2, no CUDA graphs)
#   before       tessera without the latest change that a switch can turn off
#                (TESSERA_ATTENTION_KERNEL=v2: tessera's attention kernels, not cuDNN's)
#   attention    bench_gpu_attention: the attention kernels v1, v2 and cuDNN's, one by one
#   cudnn        bench with TESSERA_ATTENTION_KERNEL=cudnn (an error if cuDNN does not load),
#                then PyTorch in the same process
#   cudnnprofile the per-kernel profile with cuDNN's attention
#   cudnndet     determinism with cuDNN's attention (its deterministic backward)
#   determinism  two runs, equal parameter hashes
#   offload      model.remat none then offload in one process (5 steps each, <= 60 s): step
#                time, allocator peak and planned device peak of each, equal params_hash
#   int8         int8 AQT training (--quant attention,mlp,head: cuBLASLt int8 GEMMs, forward
#                and both backward GEMMs), 10 steps, against the bf16 step of the bench phase
#   batch32      tessera and PyTorch at batch 32
#   reduce       bench_gpu_reduce (the step's reductions, column vs legacy)
#   batch64      tessera alone at batch 64
#   ncu          Nsight Compute on the newest kernels (multi-tensor converts and AdamW, column
#                sums, fused reductions), one launch per launch configuration
#   jax          tessera and JAX at batch 16 (not in the default list: PyTorch is the
#                faster peer, and a device call has 10 minutes)
# The default list leaves out attention and reduce (their kernels did not change since the
# last device session); CHECK_PHASES="test bench" runs a subset (a rerun of failed phases). Logs: $OUT/gpu-logs.tgz
# and, as they finish, $OUT/summary.txt; the summary table is printed last.
# CHECK_BUDGET_S (default 570: a device call has 600 s) bounds the whole script: each
# phase's time limit is cut to what is left, and a phase with under 20 s left is skipped
# (listed in the summary), so the archive of the phases run always comes back.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
FINAL="${OUT:-$ROOT/build-gpu/check}"
WORK="$(mktemp -d /tmp/gpu-check.XXXXXX)"
mkdir -p "$FINAL"
PHASES="${CHECK_PHASES:-device test spmd bench int8 before profile determinism batch32 batch64 offload ncu}"
BUDGET="${CHECK_BUDGET_S:-570}"
START=$(date +%s)
PEER_PYTHON="env LD_LIBRARY_PATH= python3"  # the peers use the machine's own CUDA libraries

# run NAME ENV... -- BUNDLE-PHASES...: one gpu-bundle.sh invocation with its own log folder.
run() {
  local name="$1"
  shift
  local env=() left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 20)); then
    echo "##### $name skipped: ${left}s of the ${BUDGET}s budget left"
    echo "$name: skipped (${left}s of the ${BUDGET}s budget left)" >>"$FINAL/summary.txt"
    return
  fi
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    # A phase's own limit, cut to the budget left (less 10 s to pack the logs).
    if [[ "$1" =~ ^(BUNDLE_[A-Z]+_TIMEOUT)=([0-9]+)$ ]] && ((BASH_REMATCH[2] > left - 10)); then
      env+=("${BASH_REMATCH[1]}=$((left - 10))")
    else
      env+=("$1")
    fi
    shift
  done
  shift
  echo "##### $name ($(date +%T), ${left}s left)"
  env "${env[@]}" OUT="$WORK/$name" BUNDLE_TAIL="${BUNDLE_TAIL:-6}" tools/gpu-bundle.sh run "$@" 2>&1 |
    tee "$WORK/$name.out" | grep -E '^(=== |\| |[a-z]+ +(ok|FAIL|TIMEOUT)|determinism|skipped)' | cut -c1-300
  grep -A20 'gpu-bundle summary' "$WORK/$name.out" | tail -n +2 | grep . | sed "s/^/$name: /" | cut -c1-600 \
    >>"$FINAL/summary.txt"
  tar -C "$WORK" -czf "$FINAL/gpu-logs.tgz" . 2>/dev/null
}

for phase in $PHASES; do
  case "$phase" in
    device) run device -- device ;;
    test) run test BUNDLE_TEST_TIMEOUT=170 -- test ;;
    spmd) run spmd TESSERA_GPU_VIRTUAL_DEVICES=8 BUNDLE_TEST_TIMEOUT=120 -- "test:*GpuSpmd*" ;;
    bench) run bench BUNDLE_BENCH_TIMEOUT=240 -- "bench:--steps:20:--warmup:5:--peers:torch:--python:$PEER_PYTHON" ;;
    profile) run profile TESSERA_PROFILE=2 TESSERA_CUDA_GRAPHS=0 BUNDLE_BENCH_TIMEOUT=90 -- bench:--steps:3:--warmup:1 ;;
    before)
      run before TESSERA_ATTENTION_KERNEL=v2 BUNDLE_BENCH_TIMEOUT=90 -- bench:--steps:20:--warmup:5
      ;;
    attention) run attention BUNDLE_ATTENTION_TIMEOUT=60 -- attention ;;
    cudnn) run cudnn TESSERA_ATTENTION_KERNEL=cudnn BUNDLE_BENCH_TIMEOUT=150 -- "bench:--steps:20:--warmup:5:--peers:torch:--python:$PEER_PYTHON" ;;
    cudnnprofile)
      run cudnnprofile TESSERA_ATTENTION_KERNEL=cudnn TESSERA_PROFILE=2 TESSERA_CUDA_GRAPHS=0 BUNDLE_BENCH_TIMEOUT=90 -- bench:--steps:3:--warmup:1
      ;;
    cudnndet) run cudnndet TESSERA_ATTENTION_KERNEL=cudnn BUNDLE_BENCH_TIMEOUT=120 -- determinism ;;
    determinism) run determinism BUNDLE_BENCH_TIMEOUT=120 -- determinism ;;
    offload) run offload BUNDLE_BENCH_TIMEOUT=60 -- bench:--steps:5:--warmup:2:--remat:none,offload ;;
    int8) run int8 BUNDLE_BENCH_TIMEOUT=90 -- bench:--steps:10:--warmup:3:--quant:attention,mlp,head ;;
    batch32) run batch32 BUNDLE_BENCH_TIMEOUT=150 -- "bench:--batch:32:--steps:10:--warmup:3:--peers:torch:--python:$PEER_PYTHON" ;;
    batch64) run batch64 BUNDLE_BENCH_TIMEOUT=90 -- bench:--batch:64:--steps:10:--warmup:3 ;;
    reduce) run reduce BUNDLE_REDUCE_TIMEOUT=60 -- reduce:--repeats:20 ;;
    jax) run jax BUNDLE_BENCH_TIMEOUT=150 -- "bench:--steps:20:--warmup:5:--peers:jax:--python:$PEER_PYTHON" ;;
    ncu) run ncu BUNDLE_NCU_TIMEOUT=120 -- "ncu:convert_multi_tensor|adamw_multi_tensor|column_chunks|_rows" ;;
    *) echo "gpu-bundle-check: unknown phase $phase" >&2 ;;
  esac
done
echo
echo "=== gpu-bundle-check summary ($FINAL)"
cut -c1-400 "$FINAL/summary.txt"
