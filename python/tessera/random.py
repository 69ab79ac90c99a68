"""Counter-based random numbers with explicit keys (jax.random's model): Philox-4x32-10,
every value a pure function of (key, shape, index)."""

from ._tessera.random import bernoulli, key, normal, split, uniform

PRNGKey = key

__all__ = ["PRNGKey", "bernoulli", "key", "normal", "split", "uniform"]
