"""NumPy basic indexing for tessera.Array (ints, slices with positive steps, None,
Ellipsis) plus one integer-array index (a gather along that axis). Arrays are
immutable: item assignment is an error that says what to do instead, x.at[i].set(v)
(JAX's functional update, built from concatenate and where, so it differentiates)."""

import numpy as np

from . import _tessera as C
from ._convert import asarray
from ._tessera import Array


def _is_int_array(value):
    if isinstance(value, Array):
        return True
    if isinstance(value, np.ndarray):
        return True
    return isinstance(value, list)


def _expand(x, index):
    """The index as a list with one entry per axis of x (Ellipsis and the missing trailing
    axes become full slices; None entries, which add axes, are kept)."""
    if not isinstance(index, tuple):
        index = (index,)
    consumed = sum(1 for i in index if i is not None and i is not Ellipsis)
    ellipses = sum(1 for i in index if i is Ellipsis)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > x.ndim:
        raise IndexError(f"too many indices for an array of shape {x.shape}: {consumed} given")
    fill = [slice(None)] * (x.ndim - consumed)
    expanded = []
    for i in index:
        expanded.extend(fill if i is Ellipsis else [i])
    return expanded if ellipses else expanded + fill


def getitem(x, index):
    expanded = _expand(x, index)

    start, stop, step = [], [], []
    squeeze_axes = []
    new_axes = []  # positions in the result
    gather = None  # (axis in the sliced array, indices)
    dim = 0
    out_pos = 0
    for i in expanded:
        if i is None:
            new_axes.append(out_pos)
            out_pos += 1
            continue
        n = x.shape[dim]
        if isinstance(i, (bool, np.bool_)):
            raise IndexError("boolean scalar indices are not supported; use tessera.where")
        if isinstance(i, (int, np.integer)):
            k = int(i)
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {dim} with size {n}")
            k %= n
            start.append(k), stop.append(k + 1), step.append(1)
            squeeze_axes.append(dim)
        elif isinstance(i, slice):
            b, e, s = i.indices(n)
            if s <= 0:
                raise IndexError(f"slice steps must be positive in tessera (axis {dim} has step {s})")
            e = max(e, b)
            start.append(b), stop.append(e), step.append(s)
            out_pos += 1
        elif _is_int_array(i):
            if gather is not None:
                raise IndexError("only one integer-array index is supported; index the axes one at a time")
            idx = i if isinstance(i, Array) else asarray(np.asarray(i))
            if idx._dtype_name == "bool":
                raise IndexError("boolean mask indices are not supported (the result's shape would depend on "
                                 "values); use tessera.where")
            if idx._dtype_name not in ("int32", "int64", "uint8", "int8", "uint32"):
                raise IndexError(f"array indices must be integers, got {idx._dtype_name}")
            start.append(0), stop.append(n), step.append(1)
            gather = (dim, idx, out_pos)
            out_pos += 1
        else:
            raise IndexError(
                f"tessera arrays are indexed by ints, slices, None, Ellipsis or one integer array; got {type(i).__name__}"
            )
        dim += 1

    y = x
    if any(b != 0 or e != n or s != 1 for b, e, s, n in zip(start, stop, step, x.shape)):
        y = C._slice(x, start, stop, step)
    if gather is not None:
        axis, idx, _ = gather
        y = C.take(y, idx, axis)
        # the gathered axis became idx.ndim axes; later squeezed axes shift
        squeeze_axes = [a + (idx.ndim - 1 if a > axis else 0) for a in squeeze_axes]
    if squeeze_axes:
        y = C.squeeze(y, squeeze_axes)
    for pos in new_axes:
        y = C.expand_dims(y, pos)
    return y


def setitem(x, index, value):
    raise TypeError(
        "tessera arrays are immutable: a[i] = v is not supported. Use b = a.at[i].set(v) (also .add, "
        ".multiply: a new array, as in JAX), or tessera.where(mask, v, a)"
    )


def _region(x, index):
    """(start, stop) per axis and the int-indexed axes, for basic indexing with ints and
    step-1 slices (what .at[] updates)."""
    expanded = _expand(x, index)
    bounds, int_axes = [], []
    for dim, (i, n) in enumerate(zip(expanded, x.shape)):
        if isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)):
            k = int(i)
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {dim} with size {n}")
            bounds.append((k % n, k % n + 1))
            int_axes.append(dim)
        elif isinstance(i, slice):
            b, e, s = i.indices(n)
            if s != 1:
                raise IndexError(f".at[] takes ints and slices with step 1 (axis {dim} has step {s})")
            bounds.append((b, max(e, b)))
        else:
            raise IndexError(f".at[] takes ints, slices with step 1 and '...'; got {type(i).__name__} at axis {dim}")
    return bounds, int_axes


def _scatter(x, index, value, how):
    bounds, int_axes = _region(x, index)
    region = [e - b for b, e in bounds]
    if isinstance(value, (int, float, bool)):
        v = C.full(region, value, x.dtype)
    else:
        v = asarray(value)
        v = C.astype(v, x.dtype) if v._dtype_name != x._dtype_name else v
        for ax in int_axes:  # the value's shape has no axis where an int indexed
            if v.ndim < len(region):
                v = C.expand_dims(v, ax)
        v = C.broadcast_to(v, region)
    mask = C.full(region, 1, "bool")
    for ax, (b, e) in enumerate(bounds):
        n = x.shape[ax]
        if b > 0 or e < n:
            before, after = list(v.shape), list(v.shape)
            before[ax], after[ax] = b, n - e
            pieces_v = [C.zeros(before, x.dtype), v, C.zeros(after, x.dtype)]
            pieces_m = [C.zeros(before, "bool"), mask, C.zeros(after, "bool")]
            v = C.concatenate([p for p in pieces_v if p.shape[ax] > 0], ax)
            mask = C.concatenate([p for p in pieces_m if p.shape[ax] > 0], ax)
    if how == "set":
        return C.where(mask, v, x)
    if how == "add":
        return C.add(x, v)
    if how == "multiply":
        return C.where(mask, C.multiply(x, v), x)
    raise AssertionError(how)


class _AtIndex:
    __slots__ = ("_x", "_index")

    def __init__(self, x, index):
        self._x, self._index = x, index

    def set(self, value):
        """A new array equal to x except x[index] = value (JAX's x.at[index].set(value))."""
        return _scatter(self._x, self._index, value, "set")

    def add(self, value):
        return _scatter(self._x, self._index, value, "add")

    def multiply(self, value):
        return _scatter(self._x, self._index, value, "multiply")

    def get(self):
        return getitem(self._x, self._index)


class _At:
    __slots__ = ("_x",)

    def __init__(self, x):
        self._x = x

    def __getitem__(self, index):
        return _AtIndex(self._x, index)
