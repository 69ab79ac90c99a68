"""tessera's array functions under the name JAX code expects (`import tessera.numpy as tnp`
for `jax.numpy as jnp`). The same functions as the top-level tessera namespace."""

from . import *  # noqa: F401,F403
from . import array, asarray  # noqa: F401
