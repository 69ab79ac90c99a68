#!/usr/bin/env bash
# One command for a GPU machine (an H100: CUDA 13 at /usr/local/cuda or in pip's nvidia
# packages, cmake, ninja, python3 with PyTorch 2 and JAX; no apt, no network, none of the
# Debian -dev packages): build tessera for sm_90 against .gpu-deps/ (made by
# tools/gpu-deps.sh on the development machine), run the GPU tests, a short CPU test subset,
# the GPU training benchmark and its PyTorch / JAX peers, and print a table.
#
#   tools/gpu-check.sh                 # every phase: device build test bench peers
#   tools/gpu-check.sh build           # one or more phases, in any order:
#   tools/gpu-check.sh test bench      #   device, build, test, bench, peers
#
# A device machine allows 10 minutes per command: run the phases in separate calls
# (build, then test bench, then peers); build-gpu/ stays between calls on a warm machine.
# Each phase records its steps in build-gpu/gpu-check/status.tsv, so the table at the end
# of every call shows every step run so far (`all` starts afresh). Every step's log is
# build-gpu/gpu-check/<step>.log; a failing step prints its tail, the later steps still
# run, and the exit status is 1 when any step in the table failed.
#
# Environment:
#   GPU_CHECK_BUILD_DIR   build directory (default build-gpu)
#   GPU_DEPS_DIR          the sysroot folder (default .gpu-deps; sysroot.tar.xz is unpacked
#                         into it when sysroot/ is missing)
#   GPU_CHECK_JOBS        build parallelism (default: nproc)
#   GPU_CHECK_TARGETS     what the build phase builds (default: test_cuda test_base
#                         test_backend tessera_cli; bench_gpu_train and bench_train are added)
#   GPU_CHECK_BUILD_TIMEOUT  seconds for the build step (default 540; run `build` again to resume)
#   GPU_CHECK_BATCH       peers' --batch (default 16)
#   GPU_CHECK_STEPS       timed steps of the peers (default 20)
#   GPU_CHECK_BENCH_ARGS  arguments of bench_gpu_train after --preset gpt2-124m (default
#                         "--peers none": the peers phase runs the peers separately)
#   GPU_CHECK_PYTHON      python with torch / jax (default: python3)
#   CUDACXX               nvcc to use (default: /usr/local/cuda/bin/nvcc, PATH, pip's nvidia)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
BUILD="${GPU_CHECK_BUILD_DIR:-build-gpu}"
DEPS="${GPU_DEPS_DIR:-$ROOT/.gpu-deps}"
SYSROOT="$DEPS/sysroot"
OUT="$BUILD/gpu-check"
STATUS="$OUT/status.tsv"
JOBS="${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 8)}"
PY="${GPU_CHECK_PYTHON:-python3}"
BATCH="${GPU_CHECK_BATCH:-16}"
PEER_STEPS="${GPU_CHECK_STEPS:-20}"
ARCH="x86_64-linux-gnu"
NVCC="" CUDA_ROOT="" CUDA_SHIM="" NCCL_INCLUDE="" NCCL_LIBRARY="" NCCL_LIB_DIR=""

phases=("$@")
if ((${#phases[@]} == 0)) || [[ " ${phases[*]} " == *" all "* ]]; then
  phases=(device build test bench peers)
  rm -f "$STATUS"
fi
for p in "${phases[@]}"; do
  case "$p" in
    device | build | test | bench | peers) ;;
    -h | --help)
      sed -n '2,30p' "$0"
      exit 0
      ;;
    *)
      echo "gpu-check.sh: unknown phase '$p' (expected device, build, test, bench, peers or all)" >&2
      exit 2
      ;;
  esac
done
mkdir -p "$OUT"
touch "$STATUS"

have() { command -v "$1" >/dev/null 2>&1; }

# record STEP STATUS SECONDS NOTE: replaces STEP's line in the status file.
record() {
  local tmp="$STATUS.tmp"
  awk -F'\t' -v s="$1" '$1 != s' "$STATUS" >"$tmp" 2>/dev/null || true
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$tmp"
  mv "$tmp" "$STATUS"
}

# run_step STEP TIMEOUT_S NOTE CMD...: runs CMD with its output in $OUT/STEP.log (and on
# the terminal), records ok/FAIL/TIMEOUT; the tail of the log is repeated on failure.
run_step() {
  local step="$1" limit="$2" note="$3"
  shift 3
  local log="$OUT/$step.log" start end rc
  echo
  echo "=== $step: $*"
  start=$(date +%s)
  if have timeout; then
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  end=$(date +%s)
  local status=ok
  if ((rc == 124 || rc == 137)); then
    status=TIMEOUT
    note="killed after ${limit} s; $note"
  elif ((rc != 0)); then
    status=FAIL
    note="exit $rc; $note"
  fi
  record "$step" "$status" "$((end - start))" "$note"
  if [[ "$status" != ok ]]; then
    echo "--- $step $status (exit $rc); last lines of $log:"
    tail -n 40 "$log" | sed 's/^/    /'
  fi
  return "$rc"
}

# ---- the sysroot and the toolchain ----

setup_deps() {
  if [[ ! -d "$SYSROOT/usr" && -f "$DEPS/sysroot.tar.xz" ]]; then
    echo "gpu-check.sh: unpacking $DEPS/sysroot.tar.xz"
    tar -C "$DEPS" -xJf "$DEPS/sysroot.tar.xz" 2>/dev/null ||  # GNU tar needs the xz program; else Python's lzma
      "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$DEPS/sysroot.tar.xz" "$DEPS"
  fi
  if [[ ! -d "$SYSROOT/usr" ]]; then
    echo "gpu-check.sh: no $SYSROOT (run tools/gpu-deps.sh on the development machine and bring" \
      ".gpu-deps/sysroot.tar.xz along); configuring against the system's libraries" >&2
    return 1
  fi
  local lib="$SYSROOT/usr/lib/$ARCH"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${NCCL_LIB_DIR:+:$NCCL_LIB_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$SYSROOT/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$SYSROOT"
  return 0
}

# Python site-packages folders (pip's nvidia wheels live there).
site_dirs() {
  "$PY" - <<'EOF' 2>/dev/null
import site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    print(d)
EOF
}

find_cuda() {
  NVCC="${CUDACXX:-}"
  if [[ -z "$NVCC" ]]; then
    for c in /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null)"; do
      [[ -n "$c" && -x "$c" ]] && NVCC="$c" && break
    done
  fi
  if [[ -z "$NVCC" ]]; then
    while IFS= read -r d; do
      for c in "$d"/nvidia/cu13/bin/nvcc "$d"/nvidia/cuda_nvcc/bin/nvcc; do
        [[ -x "$c" ]] && NVCC="$c" && break 2
      done
    done < <(site_dirs)
  fi
  [[ -n "$NVCC" ]] || return 1
  CUDA_ROOT="$(cd "$(dirname "$NVCC")/.." && pwd)"
  # pip's CUDA (nvidia/cu13) ships only versioned sonames (libcudart.so.13): give CMake's
  # FindCUDAToolkit unversioned names in a shim folder.
  CUDA_SHIM=""
  if [[ ! -e "$CUDA_ROOT/lib64/libcudart.so" && ! -e "$CUDA_ROOT/lib/libcudart.so" && -d "$CUDA_ROOT/lib" ]]; then
    CUDA_SHIM="$ROOT/$BUILD/cuda-shim"
    mkdir -p "$CUDA_SHIM"
    local so
    for so in "$CUDA_ROOT"/lib/lib*.so.*; do
      [[ -e "$so" ]] || continue
      local base="${so##*/}"
      ln -sf "$so" "$CUDA_SHIM/${base%%.so.*}.so"
    done
  fi
  # NCCL: the toolkit's, else pip's (nvidia-nccl-cu13 ships libnccl.so.2 without the .so link).
  NCCL_INCLUDE="" NCCL_LIBRARY="" NCCL_LIB_DIR=""
  if [[ ! -f "$CUDA_ROOT/include/nccl.h" ]]; then
    while IFS= read -r d; do
      for n in "$d"/nvidia/nccl "$d"/nvidia/cu13; do
        if [[ -f "$n/include/nccl.h" ]] && ls "$n"/lib/libnccl.so* >/dev/null 2>&1; then
          NCCL_INCLUDE="$n/include"
          NCCL_LIBRARY="$(ls "$n"/lib/libnccl.so* | head -1)"
          NCCL_LIB_DIR="$n/lib"
          break 2
        fi
      done
    done < <(site_dirs)
  fi
  return 0
}

cmake_dir_of() { # the folder of <Name>Config.cmake / <name>-config.cmake in the sysroot
  local f
  f="$(find "$SYSROOT/usr" -name "$1" -print -quit 2>/dev/null)"
  [[ -n "$f" ]] && dirname "$f"
}

configure_args() {
  CMAKE_ARGS=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
    -DTESSERA_BUILD_BENCH=ON -DTESSERA_BUILD_TESTS=ON)
  [[ -n "${NVCC:-}" ]] && CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$CUDA_ROOT")
  local shim="${CUDA_SHIM:+;$CUDA_SHIM}"
  if [[ -n "${NCCL_LIBRARY:-}" ]]; then
    CMAKE_ARGS+=(-DTESSERA_NCCL_INCLUDE_DIR="$NCCL_INCLUDE" -DTESSERA_NCCL_LIBRARY="$NCCL_LIBRARY")
  fi
  if [[ -d "$SYSROOT/usr" ]]; then
    local lib="$SYSROOT/usr/lib/$ARCH"
    CMAKE_ARGS+=(
      -DCMAKE_PREFIX_PATH="$SYSROOT/usr"
      -DCMAKE_LIBRARY_PATH="$lib;$lib/openblas-pthread$shim"
      -DCMAKE_INCLUDE_PATH="$SYSROOT/usr/include;$SYSROOT/usr/include/$ARCH/openblas-pthread"
      -DCMAKE_LIBRARY_ARCHITECTURE="$ARCH"
      # The build tree's binaries find the sysroot's libraries (RUNPATH does not reach
      # libdnnl's own dependencies: LD_LIBRARY_PATH covers those).
      -DCMAKE_BUILD_RPATH="$lib;$lib/openblas-pthread${NCCL_LIB_DIR:+;$NCCL_LIB_DIR}")
    local pkg dir
    for pkg in fmt:fmt-config.cmake dnnl:dnnl-config.cmake GTest:GTestConfig.cmake \
      nlohmann_json:nlohmann_jsonConfig.cmake tomlplusplus:tomlplusplusConfig.cmake CLI11:CLI11Config.cmake; do
      dir="$(cmake_dir_of "${pkg#*:}")"
      [[ -n "$dir" ]] && CMAKE_ARGS+=(-D"${pkg%%:*}_DIR=$dir")
    done
    if ! have pkg-config && [[ -x "$SYSROOT/usr/bin/pkgconf" ]]; then
      CMAKE_ARGS+=(-DPKG_CONFIG_EXECUTABLE="$SYSROOT/usr/bin/pkgconf")
    fi
  elif [[ -n "$CUDA_SHIM" ]]; then
    CMAKE_ARGS+=(-DCMAKE_LIBRARY_PATH="$CUDA_SHIM")
  fi
}

# ---- phases ----

phase_device() {
  echo "=== device"
  local note=""
  if have nvidia-smi; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee "$OUT/device.log"
    note="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 |
      sed 's/, / driver /')"
    local count
    count="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)"
    note="${count}x ${note:-?}"
  fi
  if [[ -n "${NVCC:-}" ]]; then
    echo "nvcc: $NVCC ($("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' | head -1))"
  else
    echo "nvcc: not found (CUDACXX, /usr/local/cuda/bin/nvcc, PATH, pip's nvidia/cu13)"
  fi
  echo "NCCL: ${NCCL_LIBRARY:-${CUDA_ROOT:-?}/lib (toolkit)}"
  echo "c++: $(c++ --version 2>/dev/null | head -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1); ninja: $(ninja --version 2>/dev/null)"
  echo "python: $("$PY" --version 2>&1); torch: $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo none); jax: $("$PY" -c 'import jax; print(jax.__version__, jax.devices())' 2>/dev/null || echo none)"
  echo "sysroot: $( [[ -d "$SYSROOT/usr" ]] && echo "$SYSROOT" || echo missing)"
  if [[ -z "$note" ]]; then
    record device FAIL 0 "nvidia-smi missing or no GPU"
  elif [[ -z "${NVCC:-}" ]]; then
    record device FAIL 0 "$note; no nvcc"
  else
    record device ok 0 "$note"
  fi
}

phase_build() {
  configure_args
  run_step configure 300 "cmake (sm_90, sysroot $( [[ -d "$SYSROOT/usr" ]] && echo yes || echo NO))" \
    cmake "${CMAKE_ARGS[@]}" || return 0
  # What the later phases need (the whole tree takes longer than one device call).
  local targets
  read -r -a targets <<<"${GPU_CHECK_TARGETS:-test_cuda test_base test_backend tessera_cli}"
  local all_targets
  all_targets="$(ninja -C "$BUILD" -t targets all 2>/dev/null)"
  for t in bench_gpu_train bench_train; do
    grep -q "^$t:" <<<"$all_targets" && targets+=("$t")
  done
  local missing=()
  for t in "${targets[@]}"; do grep -q "^$t:" <<<"$all_targets" || missing+=("$t"); done
  if ((${#missing[@]})); then
    echo "gpu-check.sh: no target ${missing[*]} in this build (CUDA not found? test glob?)"
    local keep=()
    for t in "${targets[@]}"; do grep -q "^$t:" <<<"$all_targets" && keep+=("$t"); done
    targets=("${keep[@]}")
  fi
  # A timed-out build resumes where it stopped when the build phase runs again.
  run_step build "${GPU_CHECK_BUILD_TIMEOUT:-540}" "${targets[*]}" \
    cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
}

phase_test() {
  if [[ ! -f "$BUILD/CTestTestfile.cmake" ]]; then
    record ctest_cuda FAIL 0 "not configured (run the build phase first)"
    return
  fi
  # -j: GPU tests share the GPU; each is a process with its own context.
  run_step ctest_cuda 540 "ctest -L cuda" \
    ctest --test-dir "$BUILD" -L cuda -j 8 --timeout 300 --output-on-failure --no-tests=error
  summarize_ctest ctest_cuda
  run_step ctest_cpu_subset 300 "ctest -L '^(base|backend)\$'" \
    ctest --test-dir "$BUILD" -L '^(base|backend)$' -j "$JOBS" --timeout 300 --output-on-failure --no-tests=error
  summarize_ctest ctest_cpu_subset
}

# Appends ctest's "N% tests passed, M failed out of T" (and the skip count) to the note.
summarize_ctest() {
  local log="$OUT/$1.log" line skipped
  line="$(grep -E 'tests passed|tests failed' "$log" | tail -1)"
  skipped="$(grep -cE '\(Skipped\)|Not Run' "$log" 2>/dev/null || true)"
  [[ -n "$line" ]] || return 0
  local current
  current="$(awk -F'\t' -v s="$1" '$1 == s {print $2 "\t" $3}' "$STATUS")"
  record "$1" "${current%%$'\t'*}" "${current#*$'\t'}" "$line; ${skipped:-0} skipped"
}

# The last line of a log that parses as a JSON object, or nothing.
last_json() {
  "$PY" - "$1" <<'EOF' 2>/dev/null
import json, sys
last = None
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if line.startswith("{") and line.endswith("}"):
        try:
            last = json.loads(line)
        except ValueError:
            pass
if last is not None:
    keys = ("tokens_per_s", "mfu", "step_ms_median", "batch", "loss_last")
    print(", ".join(f"{k} {last[k]}" for k in keys if k in last) or json.dumps(last)[:200])
EOF
}

phase_bench() {
  local bin="$BUILD/bin/bench_gpu_train"
  if [[ ! -x "$bin" ]]; then
    echo "=== bench_gpu_train: $bin is missing (not written yet, or the build failed)"
    record bench_gpu_train FAIL 0 "missing binary $bin"
    return
  fi
  # The peers phase runs the PyTorch / JAX peers on their own (bench_gpu_train would run
  # them too, which does not fit one 10-minute device call): --peers none unless
  # GPU_CHECK_BENCH_ARGS says otherwise (e.g. "--peers torch,jax --python python3").
  local extra="${GPU_CHECK_BENCH_ARGS:---peers none}"
  # shellcheck disable=SC2086
  run_step bench_gpu_train 540 "--preset gpt2-124m $extra" "$bin" --preset gpt2-124m $extra
  local summary
  summary="$(last_json "$OUT/bench_gpu_train.log")"
  [[ -n "$summary" ]] && note_append bench_gpu_train "$summary"
}

note_append() {
  local current
  current="$(awk -F'\t' -v s="$1" '$1 == s' "$STATUS")"
  [[ -n "$current" ]] || return 0
  IFS=$'\t' read -r _ st secs note <<<"$current"
  record "$1" "$st" "$secs" "$note; $2"
}

phase_peers() {
  local script name
  for name in torch jax; do
    script="bench/peers/gpt2_${name}_gpu.py"
    if ! "$PY" -c "import $name" >/dev/null 2>&1; then
      echo "=== peer_$name: $PY cannot import $name"
      record "peer_$name" FAIL 0 "$PY has no $name"
      continue
    fi
    run_step "peer_$name" 420 "batch $BATCH" "$PY" "$script" --batch "$BATCH" --steps "$PEER_STEPS" --warmup 5
    local summary
    summary="$(last_json "$OUT/peer_$name.log")"
    [[ -n "$summary" ]] && note_append "peer_$name" "$summary"
  done
}

# ---- main ----

echo "gpu-check.sh: phases ${phases[*]}; build dir $BUILD; logs $OUT"
find_cuda || true
deps_ok=1
setup_deps || deps_ok=0
((deps_ok)) || record sysroot FAIL 0 "no $SYSROOT (tools/gpu-deps.sh; carry .gpu-deps/sysroot.tar.xz)"
((deps_ok)) && record sysroot ok 0 "$SYSROOT"
for p in "${phases[@]}"; do "phase_$p"; done

echo
echo "=== gpu-check summary (build dir $BUILD; logs in $OUT)"
{
  printf 'step\tstatus\tseconds\tnote\n'
  cat "$STATUS"
} | awk -F'\t' '{ printf "%-24s %-8s %7s  %s\n", $1, $2, $3, $4 }'
if awk -F'\t' '$2 == "FAIL" || $2 == "TIMEOUT" {bad = 1} END {exit !bad}' "$STATUS"; then
  echo "gpu-check: FAILED"
  exit 1
fi
echo "gpu-check: ok"
exit 0
