"""Activations, normalization, attention and losses (fused kernels), like jax.nn."""

from ._tessera.nn import (
    cross_entropy,
    gelu,
    layer_norm,
    log_softmax,
    logsumexp,
    one_hot,
    relu,
    rms_norm,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    swish,
    tanh,
)

__all__ = [
    "cross_entropy",
    "gelu",
    "layer_norm",
    "log_softmax",
    "logsumexp",
    "one_hot",
    "relu",
    "rms_norm",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "softmax",
    "swish",
    "tanh",
]
