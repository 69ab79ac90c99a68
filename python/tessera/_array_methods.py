"""Python's operators and NumPy's methods on tessera.Array (installed at import)."""

import numpy as np

from . import _dtypes
from . import _tessera as C
from ._convert import to_numpy
from ._indexing import _At, getitem, setitem
from ._tessera import Array


def _axis_args(args):
    # a.transpose(1, 0) and a.transpose((1, 0)); a.reshape(2, 3) and a.reshape((2, 3)).
    if len(args) == 1 and (isinstance(args[0], (tuple, list)) or args[0] is None):
        return args[0]
    return args


def _array(self, dtype=None, copy=None):
    a = to_numpy(self)
    if dtype is not None and np.dtype(dtype) != a.dtype:
        return a.astype(dtype)
    if copy:
        return a.copy()
    return a


def _dlpack(self, *, stream=None, max_version=None, dl_device=None, copy=None):
    # A DLPack capsule over the buffer (the array stays alive until the consumer is done).
    if copy:
        raise BufferError("tessera.Array.__dlpack__: copy=True is not supported (the export never copies)")
    return self._dlpack_view()


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d array")
    for i in range(self.shape[0]):
        yield getitem(self, i)


def _repr(self):
    try:
        values = np.array2string(to_numpy(self), separator=", ", prefix="Array(")
    except Exception as e:  # a traced value has none: say what it is
        return f"Array(traced {C._type_string(self)}: {type(e).__name__})"
    return f"Array({values}, dtype={self._dtype_name})"


def _bool(self):
    if self.size != 1:
        raise ValueError(
            f"the truth value of an array with {self.size} elements is ambiguous; use tessera.any / all or compare"
        )
    return bool(self.item())


def _index(self):
    if self._dtype_name in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"only integer arrays can be used as an index (this one is {self._dtype_name})")
    return int(self.item())


def _reduction_method(fn):
    # NumPy's signature (np.sum(a) calls a.sum(axis=None, dtype=None, out=None)).
    def method(self, axis=None, dtype=None, out=None, keepdims=False, **unused):
        if out is not None:
            raise TypeError(f"{fn.__name__}: out= is not supported (tessera arrays are immutable)")
        x = self if dtype is None else C.astype(self, dtype)
        return fn(x, axis, keepdims)

    method.__name__ = fn.__name__
    return method


def install():
    A = Array
    A.dtype = property(lambda self: _dtypes.DTYPES[self._dtype_name], doc="The NumPy dtype of the elements.")
    A.T = property(lambda self: C.transpose(self))
    A.mT = property(lambda self: C.swapaxes(self, -1, -2))
    A.sharding = property(lambda self: C._sharding_of(self), doc="The Sharding of a sharded array, else None.")
    A.addressable_shards = property(lambda self: C._addressable_shards(self))
    A.__array__ = _array
    A.__array_priority__ = 100
    A.__array_ufunc__ = None  # numpy scalars and arrays defer to the reflected operators
    A.__dlpack__ = _dlpack
    A.__dlpack_device__ = lambda self: (1, 0)  # kDLCPU
    A.__float__ = lambda self: float(self.item())
    A.__int__ = lambda self: int(self.item())
    A.__index__ = _index
    A.__bool__ = _bool
    A.__iter__ = _iter
    A.__repr__ = _repr
    A.__str__ = lambda self: str(to_numpy(self))
    A.__getitem__ = getitem
    A.__setitem__ = setitem
    A.at = property(lambda self: _At(self), doc="Functional updates: x.at[i].set(v) / .add(v) / .multiply(v).")
    A.tolist = lambda self: to_numpy(self).tolist()
    A.astype = lambda self, dtype: C.astype(self, dtype)
    A.reshape = lambda self, *shape: C.reshape(self, _axis_args(shape))
    A.transpose = lambda self, *axes: C.transpose(self, _axis_args(axes) if axes else None)
    A.swapaxes = lambda self, a, b: C.swapaxes(self, a, b)
    A.squeeze = lambda self, axis=None: C.squeeze(self, axis)
    A.flatten = lambda self: C.ravel(self)
    A.ravel = lambda self: C.ravel(self)
    for name in ("sum", "mean", "max", "min", "prod", "var"):
        setattr(A, name, _reduction_method(getattr(C, name)))
    A.argmax = lambda self, axis=None, keepdims=False: C.argmax(self, axis, keepdims)
    A.argmin = lambda self, axis=None, keepdims=False: C.argmin(self, axis, keepdims)

    A.__add__ = lambda self, other: C.add(self, other)
    A.__radd__ = lambda self, other: C.add(other, self)
    A.__sub__ = lambda self, other: C.subtract(self, other)
    A.__rsub__ = lambda self, other: C.subtract(other, self)
    A.__mul__ = lambda self, other: C.multiply(self, other)
    A.__rmul__ = lambda self, other: C.multiply(other, self)
    A.__truediv__ = lambda self, other: C.divide(self, other)
    A.__rtruediv__ = lambda self, other: C.divide(other, self)
    A.__pow__ = lambda self, other: C.power(self, other)
    A.__rpow__ = lambda self, other: C.power(other, self)
    A.__matmul__ = lambda self, other: C.matmul(self, other)
    A.__rmatmul__ = lambda self, other: C.matmul(other, self)
    A.__neg__ = lambda self: C.negative(self)
    A.__pos__ = lambda self: self
    A.__abs__ = lambda self: C.abs(self)
    A.__eq__ = lambda self, other: C.equal(self, other)
    A.__ne__ = lambda self, other: C.not_equal(self, other)
    A.__lt__ = lambda self, other: C.less(self, other)
    A.__le__ = lambda self, other: C.less_equal(self, other)
    A.__gt__ = lambda self, other: C.greater(self, other)
    A.__ge__ = lambda self, other: C.greater_equal(self, other)
    A.__and__ = lambda self, other: C.logical_and(self, other)
    A.__rand__ = lambda self, other: C.logical_and(other, self)
    A.__or__ = lambda self, other: C.logical_or(self, other)
    A.__ror__ = lambda self, other: C.logical_or(other, self)
    A.__invert__ = lambda self: C.logical_not(self)
