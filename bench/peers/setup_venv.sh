#!/usr/bin/env bash
# Creates (once) a cached Python venv with the CPU peers of the training benchmark:
# PyTorch 2 (eager + torch.compile) and JAX on the CPU, at pinned versions, from PyPI only.
#
#   bash bench/peers/setup_venv.sh          # prints the venv path on its last line
#   PEERS_VENV=/some/dir bash bench/peers/setup_venv.sh
#   PEERS_FORCE=1 bash ...                  # rebuild even if the stamp matches
#
# Why torch is installed this way (details in bench/peers/README.md): PyPI's only Linux x86_64
# torch wheel is the CUDA build. Its libtorch_cpu.so / libtorch_python.so / libtorch.so have
# DT_NEEDED entries on the CUDA runtime libraries, so `pip install --no-deps torch` alone does
# not import. We install torch with --no-deps, its small pure-Python requirements, and only
# the nvidia-* wheels that ship a library torch links against. We leave out triton (GPU
# compiler only; Inductor's CPU backend generates C++ and does not import it), cuda-bindings,
# cuda-pathfinder, the cuda-toolkit meta package, the CCCL headers and NVTX (optional).
# The machine also needs g++ (torch.compile) and libtcmalloc-minimal4 (the "tuned" torch env).
set -euo pipefail

VENV="${PEERS_VENV:-$HOME/.cache/tessera-peers-venv}"
PYTHON="${PYTHON:-python3}"

TORCH_VERSION=2.15.0
JAX_VERSION=0.10.2
OPTAX_VERSION=0.2.8
NUMPY_VERSION=2.4.6

# Pure-Python requirements of torch 2.15 (its Requires-Dist, minus the CUDA ones) and
# their own requirements, pinned.
TORCH_PY_DEPS=(filelock==4.2.11 typing-extensions==4.16.0 setuptools==84.2.1 sympy==1.14.0 mpmath==1.3.0
  networkx==3.6.1 jinja2==3.1.6 markupsafe==3.0.4 fsspec==2026.9.0)
# jax[cpu] and optax with every requirement pinned (the set pip resolved for them).
JAX_DEPS=(jaxlib==$JAX_VERSION ml_dtypes==0.6.0 opt_einsum==3.4.0 scipy==1.17.1 absl-py==2.5.1)
# The nvidia wheels whose shared libraries torch 2.15's libraries have as DT_NEEDED, with the
# versions torch 2.15 requires (checked with `readelf -d torch/lib/*.so | grep NEEDED`).
TORCH_NVIDIA_LIBS=(nvidia-cuda-runtime==13.2.86 nvidia-cuda-cupti==13.2.86 nvidia-cuda-nvrtc==13.2.86
  nvidia-cublas==13.4.1.3 nvidia-cudnn-cu13==9.26.0.51 nvidia-cufft==12.2.0.57 nvidia-cufile==1.17.1.22
  nvidia-cusolver==12.2.0.11 nvidia-cusparse==12.7.10.12 nvidia-cusparselt-cu13==0.8.1
  nvidia-nvjitlink==13.5.37 nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.7.2)

STAMP_TEXT="torch=$TORCH_VERSION jax=$JAX_VERSION optax=$OPTAX_VERSION numpy=$NUMPY_VERSION v1"
STAMP="$VENV/.tessera-peers-stamp"

if [[ -z "${PEERS_FORCE:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_TEXT" ]]; then
  echo "$VENV"
  exit 0
fi

command -v g++ >/dev/null || { echo "setup_venv.sh: g++ is needed by torch.compile (apt-get install g++)" >&2; exit 1; }
if [[ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ]]; then
  echo "setup_venv.sh: installing libtcmalloc-minimal4 (tuned torch env)" >&2
  SUDO=$([[ "$(id -u)" == 0 ]] || echo sudo)
  $SUDO apt-get install -y -q libtcmalloc-minimal4 >&2 ||
    { $SUDO apt-get update -q >&2 && $SUDO apt-get install -y -q libtcmalloc-minimal4 >&2; }
fi

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "numpy==$NUMPY_VERSION"
"${PIP[@]}" --no-deps "torch==$TORCH_VERSION" "${TORCH_PY_DEPS[@]}" "${TORCH_NVIDIA_LIBS[@]}"
"${PIP[@]}" "jax[cpu]==$JAX_VERSION" "optax==$OPTAX_VERSION" "numpy==$NUMPY_VERSION" "${JAX_DEPS[@]}"

# Smoke test: import, a matmul, and torch.compile of a small model (forward + backward) on the CPU; a JAX jit.
"$VENV/bin/python" - <<'EOF' >&2
import os, tempfile
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-smoke-"))
import torch
a = torch.randn(64, 64)
assert torch.allclose(a @ torch.eye(64), a)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
ref = m(x)
cm = torch.compile(m)
out = cm(x)
out.sum().backward()
assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
import jax, jax.numpy as jnp, optax
y = jax.jit(lambda v: jnp.tanh(v @ v.T).sum())(jnp.ones((8, 8)))
print(f"setup_venv.sh: torch {torch.__version__} (cuda available: {torch.cuda.is_available()}), "
      f"torch.compile ok; jax {jax.__version__} {jax.devices()} ok; optax {optax.__version__}")
EOF
echo "$STAMP_TEXT" > "$STAMP"
echo "$VENV"
