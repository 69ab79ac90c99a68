"""SPMD layouts, with JAX's spellings (jax.sharding): Mesh, PartitionSpec / P,
NamedSharding, make_mesh. Devices are tessera's: TESSERA_CPU_DEVICES=N virtual CPU
devices in one process (or one per MPI rank)."""

from ._tessera import Mesh, NamedSharding, PartitionSpec, Sharding, device_count

P = PartitionSpec

__all__ = ["Mesh", "NamedSharding", "PartitionSpec", "P", "Sharding", "make_mesh"]


def make_mesh(axis_shapes, axis_names):
    """A mesh of prod(axis_shapes) devices (jax.make_mesh); the runtime must have that many."""
    mesh = Mesh(tuple(axis_shapes), tuple(axis_names))
    if mesh.size > device_count():
        raise ValueError(
            f"make_mesh: the mesh {mesh!r} needs {mesh.size} devices, this runtime has {device_count()} "
            "(set TESSERA_CPU_DEVICES before importing tessera for virtual CPU devices)"
        )
    return mesh
