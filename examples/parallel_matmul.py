"""The seeds' SPMD hello world (a JAX program sharding one matrix over a 4x64 TPU mesh and
multiplying it by its transpose), line for line in tessera's spelling, on virtual CPU
devices. It checks itself against NumPy in float64 and exits 1 on a mismatch.

    TESSERA_CPU_DEVICES=8 PYTHONPATH=build/python python3 examples/parallel_matmul.py [--size N]
"""

import argparse
import sys

import numpy as np

import tessera
import tessera.numpy as tnp  # noqa: F401  (jax.numpy's counterpart; unused, as in the seed)
from tessera.sharding import Mesh, NamedSharding, PartitionSpec

parser = argparse.ArgumentParser()
parser.add_argument("--size", type=int, default=1024, help="the matrix is size x size (the seed's is 8192)")
size = parser.parse_args().size

devices = tessera.device_count()
data = 4 if devices % 4 == 0 else 1
mesh = Mesh((data, devices // data), axis_names=("data", "model"))  # the seed's (4, 64) TPU grid
x = tessera.random.normal(tessera.random.key(0), (size, size))
sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
x_sharded = tessera.device_put(x, sharding)


@tessera.jit
def parallel_matmul(mat):
    return mat @ mat.T


# Run
print(f"Running on {devices} devices...")
result = parallel_matmul(x_sharded)
print("Computation complete.")

# The check: the same product in float64 on the host.
want = np.asarray(x).astype(np.float64) @ np.asarray(x).astype(np.float64).T
err = np.max(np.abs(np.asarray(result) - want)) / np.max(np.abs(want))
print(f"mesh {mesh}, result {result.shape} laid out {result.sharding}, max relative error {err:.2e}")
sys.exit(0 if err < 1e-5 else 1)
