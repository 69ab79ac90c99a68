"""Values into tessera.Array and back to NumPy.

Into tessera: a NumPy array keeps its dtype (float64 stays float64: round trips are
bitwise); Python scalars and nested lists take JAX's defaults (float32, int32, bool);
objects with __dlpack__ (PyTorch tensors, bfloat16 included) or __array__ go through
them. The bytes are copied once: tessera arrays are immutable and a NumPy array can
change after the call. Out to NumPy nothing is copied: the NumPy array is a read-only
view of the tessera buffer, which it keeps alive.
"""

import numpy as np

from . import _dtypes
from ._tessera import Array, _from_ndarray


def _from_numpy(a, what):
    a = np.asarray(a, order="C")
    name = a.dtype.name
    if name not in _dtypes.DTYPES:
        if a.dtype.kind == "O":
            raise TypeError(f"{what}: cannot make an array of Python objects ({a!r:.80})")
        raise TypeError(f"{what}: tessera has no dtype {name!r} (it has {', '.join(_dtypes.DTYPES)})")
    return _from_ndarray(a.view(_dtypes.RAW[a.dtype.itemsize]), name)


def _python_sequence_dtype(a):
    # Python numbers take JAX's default widths, not NumPy's.
    if a.dtype == np.float64:
        return np.float32
    if a.dtype == np.int64:
        return np.int32
    return None


def array_from_object(value, what="array"):
    """Installed in the C++ layer: any array-like (not an Array or a Python scalar)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return _from_numpy(value, what)
    if hasattr(value, "__dlpack__") and not isinstance(value, (list, tuple)):
        try:
            return _from_ndarray(value)
        except TypeError:
            pass  # a DLPack type tessera lacks (say PyTorch's int16): NumPy's conversion says so
    if hasattr(value, "__array__"):
        return _from_numpy(np.asarray(value), what)
    if isinstance(value, (list, tuple)):
        try:
            a = np.asarray(value)
        except ValueError as e:
            raise ValueError(f"{what}: a ragged nested sequence is not an array ({e})") from None
        if a.dtype.kind == "O":
            raise TypeError(f"{what}: expected an array-like of numbers, got {value!r:.80}")
        narrower = _python_sequence_dtype(a)
        return _from_numpy(a.astype(narrower) if narrower else a, what)
    raise TypeError(f"{what}: expected an array, a scalar or an array-like, got {type(value).__name__}")


def asarray(value, dtype=None):
    """value as a tessera.Array (an Array is returned as is, or cast to `dtype`)."""
    from . import _tessera as C

    if isinstance(value, Array):
        a = value
    elif type(value) in (bool, int, float) and dtype is not None:
        return C._scalar(float(value), _dtypes.dtype(dtype).name)
    elif type(value) is bool:
        a = C._scalar(float(value), "bool")
    elif type(value) is int:
        a = C._scalar(float(value), "int32")
    elif type(value) is float:
        a = C._scalar(value, "float32")
    else:
        a = array_from_object(value)
    if dtype is not None and a._dtype_name != _dtypes.dtype(dtype).name:
        a = C.astype(a, _dtypes.dtype(dtype).name)
    return a


array = asarray


def from_dlpack(value):
    """A tessera.Array from an object with __dlpack__ (PyTorch tensors, NumPy arrays...)."""
    return _from_ndarray(value)


def to_numpy(a):
    """A read-only NumPy view of a's buffer (a is computed first)."""
    return a._raw_view().view(_dtypes.DTYPES[a._dtype_name])
