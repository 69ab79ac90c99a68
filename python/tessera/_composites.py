"""NumPy / jax.nn functions written with tessera's ops (so they differentiate, batch and
compile like any other). Each says what it is built from."""

import builtins

from . import _tessera as C
from ._convert import asarray


def clip(a, a_min=None, a_max=None):
    """minimum(maximum(a, a_min), a_max); either bound may be None."""
    a = asarray(a)
    if a_min is not None:
        a = C.maximum(a, a_min)
    if a_max is not None:
        a = C.minimum(a, a_max)
    return a


def std(a, axis=None, keepdims=False):
    """sqrt(var): the population standard deviation (ddof 0)."""
    return C.sqrt(C.var(a, axis, keepdims))


def tan(x):
    return C.divide(C.sin(x), C.cos(x))


def isnan(x):
    x = asarray(x)
    return C.not_equal(x, x)


def isinf(x):
    return C.equal(C.abs(x), float("inf"))


def isfinite(x):
    x = asarray(x)
    return C.logical_and(C.equal(x, x), C.less(C.abs(x), float("inf")))


def any(a, axis=None, keepdims=False):  # noqa: A001 (numpy's name)
    """Whether any element is true (nonzero), via a max over a 0/1 array."""
    return C.greater(C.max(C.astype(C.not_equal(a, 0), "int32"), axis, keepdims), 0)


def all(a, axis=None, keepdims=False):  # noqa: A001
    return C.greater(C.min(C.astype(C.not_equal(a, 0), "int32"), axis, keepdims), 0)


def eye(n, m=None, k=0, dtype=None):
    """Ones on the k-th diagonal of an n x m matrix."""
    m = n if m is None else m
    rows = C.expand_dims(C.arange(n), 1)
    cols = C.expand_dims(C.arange(m), 0)
    return C.astype(C.equal(cols - rows, k), dtype or "float32")


def tri_mask(n, m, k, lower):
    rows = C.expand_dims(C.arange(n), 1)
    cols = C.expand_dims(C.arange(m), 0)
    return C.less_equal(cols - rows, k) if lower else C.greater_equal(cols - rows, k)


def tril(a, k=0):
    a = asarray(a)
    return C.where(tri_mask(a.shape[-2], a.shape[-1], k, True), a, C.zeros_like(a))


def triu(a, k=0):
    a = asarray(a)
    return C.where(tri_mask(a.shape[-2], a.shape[-1], k, False), a, C.zeros_like(a))


def flip(a, axis=None):
    """Reversed along `axis` (all axes when None): a gather with reversed indices."""
    a = asarray(a)
    axes = range(a.ndim) if axis is None else ([axis] if isinstance(axis, int) else axis)
    for ax in axes:
        n = a.shape[ax]
        a = C.take(a, C.arange(n - 1, -1, -1), ax)
    return a


def split(a, indices_or_sections, axis=0):
    """numpy.split: equal sections (which must divide the axis) or split points."""
    a = asarray(a)
    n = a.shape[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ValueError(f"split: axis {axis} of size {n} does not divide into {indices_or_sections} equal sections")
        step = n // indices_or_sections
        points = list(range(step, n, step))
    else:
        points = list(indices_or_sections)
    bounds = [0] + [builtins.min(builtins.max(p, 0), n) for p in points] + [n]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        start = [0] * a.ndim
        stop = list(a.shape)
        start[axis % a.ndim], stop[axis % a.ndim] = lo, builtins.max(hi, lo)
        out.append(C._slice(a, start, stop, [1] * a.ndim))
    return out


def repeat(a, repeats, axis=None):
    """numpy.repeat with an int count: each element `repeats` times along `axis` (the
    flattened array when None)."""
    a = asarray(a)
    if axis is None:
        a, axis = C.ravel(a), 0
    axis %= a.ndim
    shape = list(a.shape)
    expanded = C.expand_dims(a, axis + 1)
    target = shape[: axis + 1] + [int(repeats)] + shape[axis + 1:]
    shape[axis] *= int(repeats)
    return C.reshape(C.broadcast_to(expanded, target), shape)


def tile(a, reps):
    """numpy.tile: the array repeated `reps` times along each axis."""
    a = asarray(a)
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    if len(reps) > a.ndim:
        a = C.reshape(a, (1,) * (len(reps) - a.ndim) + tuple(a.shape))
    reps = (1,) * (a.ndim - len(reps)) + reps
    # [r0, d0, r1, d1, ...] broadcast, then merged.
    inter = []
    target = []
    for r, d in zip(reps, a.shape):
        inter += [1, d]
        target += [r, d]
    out = C.broadcast_to(C.reshape(a, inter), target)
    return C.reshape(out, [r * d for r, d in zip(reps, a.shape)])


def pad(a, pad_width, constant_values=0):
    """numpy.pad in 'constant' mode: pad_width an int, a (before, after) pair, or one pair per axis."""
    a = asarray(a)
    if isinstance(pad_width, int):
        pad_width = [(pad_width, pad_width)] * a.ndim
    elif len(pad_width) == 2 and isinstance(pad_width[0], int):
        pad_width = [tuple(pad_width)] * a.ndim
    for ax, (before, after) in enumerate(pad_width):
        parts = []
        for count in (before, after):
            shape = list(a.shape)
            shape[ax] = count
            parts.append(C.full(shape, constant_values, a.dtype) if count else None)
        pieces = [p for p in (parts[0], a, parts[1]) if p is not None]
        if len(pieces) > 1:
            a = C.concatenate(pieces, ax)
    return a


def softplus(x):
    """log(1 + exp(x)), computed stably as log1p(exp(-|x|)) + max(x, 0)."""
    x = asarray(x)
    return C.add(C.log1p(C.exp(C.negative(C.abs(x)))), C.maximum(x, 0.0))


def log_sigmoid(x):
    return C.negative(softplus(C.negative(asarray(x))))
