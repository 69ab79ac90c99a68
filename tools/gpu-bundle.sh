#!/usr/bin/env bash
# Prebuilt GPU bundle: build tessera's GPU binaries here (sm_90) and run them on a GPU
# machine that has the CUDA driver and runtime libraries but no compiler toolchain for
# tessera's Debian dependencies, without building there.
#
#   tools/gpu-bundle.sh make [TARGET...]   # here: build-sm90/, then .gpucarry/bundle.tar.xz
#                                          # (default targets: test_cuda bench_gpu_train
#                                          # bench_gpu_attention bench_gpu_reduce tessera_cli)
#   tools/gpu-bundle.sh run PHASE...       # there: unpack the bundle, find the CUDA libraries,
#                                          # run the phases, print a table last
#
# Phases of `run`:
#   device                 nvidia-smi, the libraries found, python / torch / jax versions
#   test[:FILTER]          bin/test_cuda (gtest filter FILTER, default all)
#   bench[:ARGS]           bin/bench_gpu_train --preset gpt2-124m --peers none ARGS (':'-separated
#                          words become spaces: bench:--batch:32)
#   reduce[:ARGS]          bin/bench_gpu_reduce ARGS (make it with: make test_cuda bench_gpu_reduce)
#   attention[:ARGS]       bin/bench_gpu_attention ARGS (flash-attention kernels v1 vs v2)
#   torch[:ARGS] jax[:ARGS] the peers bench/peers/gpt2_{torch,jax}_gpu.py ARGS
#   cli[:ARGS]             bin/tessera ARGS
#   determinism[:ARGS]     bench_gpu_train twice (8 steps, no warm-up, ARGS added): the two
#                          runs' params_hash must be equal
#   ncu[:REGEX[:COUNT]]    Nsight Compute (SpeedOfLight, Occupancy, LaunchStats, WarpStateStats)
#                          on the first COUNT (default 1) launches of each launch configuration
#                          of the kernels matching REGEX, in one bench_gpu_train step
# Logs go to $OUT (or build-gpu/bundle-logs) as N-PHASE.log; each phase has its own time
# limit (BUNDLE_<PHASE>_TIMEOUT seconds). Environment variables reach the phases'
# programs, e.g. TESSERA_PROFILE=2 TESSERA_CUDA_GRAPHS=0 for a kernel profile.
#
# The bundle holds the stripped binaries and every shared library they need outside glibc,
# libstdc++ and CUDA (OpenBLAS, oneDNN, Open MPI, fmt, ...), copied from this machine: the
# GPU machine's own glibc and libstdc++ must be at least as new (Debian 12: glibc 2.36).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
CARRY="$ROOT/.gpucarry"
BUNDLE="$CARRY/bundle.tar.xz"

make_bundle() {
  local targets=("$@")
  ((${#targets[@]})) || targets=(test_cuda bench_gpu_train bench_gpu_attention bench_gpu_reduce tessera_cli)
  cmake -S . -B build-sm90 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTESSERA_BUILD_BENCH=ON -DTESSERA_BUILD_TESTS=ON >/dev/null || return 1
  CCACHE_BASEDIR="$ROOT" cmake --build build-sm90 -j "$(nproc)" --target "${targets[@]}" || return 1
  rm -rf "$CARRY/stage"
  mkdir -p "$CARRY/stage/bin" "$CARRY/stage/lib"
  local t bin
  for t in "${targets[@]}"; do
    bin="build-sm90/bin/${t%_cli}"
    [[ -x "$bin" ]] || bin="build-sm90/bin/$t"
    cp "$bin" "$CARRY/stage/bin/" && strip --strip-unneeded "$CARRY/stage/bin/${bin##*/}"
  done
  local lib
  for lib in $(for b in "$CARRY"/stage/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/usr/local/cuda|/libc\.so|/libm\.so|ld-linux|libstdc\+\+|libgcc_s|libdl\.so|libpthread|librt\.so'); do
    cp -L "$lib" "$CARRY/stage/lib/"
  done
  tar -C "$CARRY/stage" -cf - . | xz -T0 -6 >"$BUNDLE.tmp" && mv "$BUNDLE.tmp" "$BUNDLE"
  echo "gpu-bundle: $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); carry .gpucarry/bundle.tar.xz"
}

# Folders holding the CUDA libraries the binaries link: the toolkit's, else pip's nvidia wheels.
cuda_lib_dirs() {
  python3 - <<'EOF' 2>/dev/null
import glob, os, site
wanted = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13", "libnccl.so.2")
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/targets/x86_64-linux/lib",
         "/usr/lib/x86_64-linux-gnu"]
for d in site.getsitepackages():
    roots += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib")))
found, dirs = set(), []
for r in roots:
    hits = [w for w in wanted if w not in found and os.path.exists(os.path.join(r, w))]
    if hits:
        found.update(hits)
        dirs.append(r)
print(":".join(dirs))
missing = [w for w in wanted if w not in found]
if missing:
    import sys
    print("gpu-bundle: not found: " + " ".join(missing), file=sys.stderr)
EOF
}

STATUS_LINES=()
run_phase() { # NAME TIMEOUT CMD...
  local name="$1" limit="$2"
  shift 2
  PHASE_COUNT=$((${PHASE_COUNT:-0} + 1))
  local log="$LOGS/$PHASE_COUNT-$name.log" start rc
  echo "=== $name: $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - start)) status=ok
  ((rc == 124 || rc == 137)) && status=TIMEOUT
  [[ $rc != 0 && $status == ok ]] && status="FAIL($rc)"
  tail -n "${BUNDLE_TAIL:-15}" "$log"
  STATUS_LINES+=("$(printf '%-10s %-9s %5ss  %s' "$name" "$status" "$secs" "$(grep -E '^\{' "$log" | tail -1 | cut -c1-400)")")
}

run_bundle() {
  LOGS="${OUT:-$ROOT/build-gpu/bundle-logs}"
  mkdir -p "$LOGS"
  local dir="/tmp/tessera-bundle" sum
  # Unpacked again whenever the bundle changed: a warm machine (or a rehearsal here) keeps
  # the previous call's binaries, which must not run in place of the new ones.
  sum="$(cksum <"$BUNDLE")"
  if [[ ! -d "$dir/bin" || "$(cat "$dir/.bundle-sum" 2>/dev/null)" != "$sum" ]]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    tar -C "$dir" -xJf "$BUNDLE" 2>/dev/null ||
      python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$BUNDLE" "$dir" || exit 2
    echo "$sum" >"$dir/.bundle-sum"
  fi
  local cuda_dirs
  cuda_dirs="$(cuda_lib_dirs)"
  export LD_LIBRARY_PATH="$dir/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$dir/bin:$PATH"
  local phase name args
  for phase in "$@"; do
    name="${phase%%:*}"
    args=()
    [[ "$phase" == *:* ]] && IFS=':' read -r -a args <<<"${phase#*:}"
    case "$name" in
      device)
        {
          nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
          echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
          ldd "$dir/bin/test_cuda" | grep -E "not found|cuda|cublas|nvrtc|nccl"
          # The toolkit's cuDNN headers, if any. (On the H100 machine of 2026-11-26 a cuDNN
          # 9.14 was on the bundle's library path; torch bundles 9.19 and refuses the older
          # one, hence python3 without LD_LIBRARY_PATH.)
          grep -h -E '#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ' /usr/local/cuda/include/cudnn_version*.h 2>/dev/null
          # The cuDNN tessera opens (TESSERA_CUDNN_LIBRARY, default libcudnn.so.9 on the
          # library path) and the copies on this machine.
          "$dir/bin/tessera" info | grep -E "GPU|cuDNN"
          timeout 20 find / -xdev -name 'libcudnn.so.9*' 2>/dev/null | head
          LD_LIBRARY_PATH="" python3 -c '
import torch, jax
try:
    cudnn = torch.backends.cudnn.version()
except Exception as e:
    cudnn = "unavailable (%s)" % e
print("torch", torch.__version__, torch.version.cuda, "cudnn", cudnn, "jax", jax.__version__)'
        } 2>&1 | tee "$LOGS/0-device.log"
        ;;
      test)
        # The filter is the whole rest of the phase (gtest separates patterns with ':').
        local filter=""
        [[ "$phase" == *:* ]] && filter="${phase#*:}"
        run_phase test "${BUNDLE_TEST_TIMEOUT:-300}" "$dir/bin/test_cuda" ${filter:+--gtest_filter="$filter"}
        echo "skipped: $(grep -c '^\[  SKIPPED \] [A-Z]' "$LOGS/$PHASE_COUNT-test.log"); failures:"
        grep -E '^\[  FAILED  \]|Failure$|rror' "$LOGS/$PHASE_COUNT-test.log" | sort -u | head -60
        ;;
      bench)
        run_phase bench "${BUNDLE_BENCH_TIMEOUT:-180}" "$dir/bin/bench_gpu_train" --preset gpt2-124m --peers none "${args[@]}"
        ;;
      reduce)
        run_phase reduce "${BUNDLE_REDUCE_TIMEOUT:-120}" "$dir/bin/bench_gpu_reduce" "${args[@]}"
        ;;
      attention)
        [[ -x "$dir/bin/bench_gpu_attention" ]] || { echo "gpu-bundle: no bench_gpu_attention in the bundle" >&2; continue; }
        run_phase attention "${BUNDLE_ATTENTION_TIMEOUT:-120}" "$dir/bin/bench_gpu_attention" "${args[@]}"
        ;;
      torch | jax)
        PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="" run_phase "$name" "${BUNDLE_PEER_TIMEOUT:-200}" \
          python3 "bench/peers/gpt2_${name}_gpu.py" "${args[@]}"
        ;;
      cli)
        run_phase cli "${BUNDLE_CLI_TIMEOUT:-200}" "$dir/bin/tessera" "${args[@]}"
        ;;
      ncu)
        run_phase ncu "${BUNDLE_NCU_TIMEOUT:-150}" ncu --clock-control none --section SpeedOfLight \
          --section Occupancy --section LaunchStats --section WarpStateStats -k "regex:${args[0]:-.}" \
          --filter-mode per-launch-config -c "${args[1]:-1}" \
          "$dir/bin/bench_gpu_train" --preset gpt2-124m --peers none --steps 1 --warmup 0
        ;;
      determinism)
        # shellcheck disable=SC2016 # $0 and $@ belong to the inner shell
        run_phase determinism "${BUNDLE_BENCH_TIMEOUT:-180}" bash -c \
          'for run in 1 2; do "$0" --preset gpt2-124m --peers none --steps 8 --warmup 0 "$@" || exit; done' \
          "$dir/bin/bench_gpu_train" "${args[@]}"
        local hashes
        hashes="$(grep -o '"params_hash":"[0-9a-f]*"' "$LOGS/$PHASE_COUNT-determinism.log" | sort -u)"
        if [[ $(grep -c . <<<"$hashes") == 1 ]]; then
          echo "determinism: both runs end with $hashes"
        else
          echo "determinism: the runs DIFFER: $hashes"
          STATUS_LINES+=("determinism FAIL: the two runs' params_hash differ")
        fi
        ;;
      *)
        echo "gpu-bundle: unknown phase $name" >&2
        ;;
    esac
  done
  echo
  echo "=== gpu-bundle summary"
  printf '%s\n' "${STATUS_LINES[@]}"
}

case "${1:-}" in
  make)
    shift
    make_bundle "$@"
    ;;
  run)
    shift
    run_bundle "$@"
    ;;
  *)
    sed -n '2,20p' "$0"
    exit 2
    ;;
esac
