"""tessera's dtypes as NumPy dtypes (bfloat16 from ml_dtypes, JAX's own dtype package)."""

import ml_dtypes
import numpy as np

bool_ = np.dtype(np.bool_)
uint8 = np.dtype(np.uint8)
int8 = np.dtype(np.int8)
uint32 = np.dtype(np.uint32)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

# name -> NumPy dtype, for every dtype tessera has.
DTYPES = {d.name: d for d in (bool_, uint8, int8, uint32, int32, int64, float16, bfloat16, float32, float64)}

# The unsigned integer type of each element size: arrays cross the C++ boundary as raw
# elements of that type and are viewed as their real dtype on the NumPy side.
RAW = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def dtype(value):
    """The NumPy dtype of a dtype-like (a name, a NumPy type, a dtype) that tessera supports."""
    d = np.dtype(value)
    if d.name not in DTYPES:
        raise TypeError(f"tessera has no dtype {d.name!r} (it has {', '.join(DTYPES)})")
    return d


def finfo(value):
    return ml_dtypes.finfo(dtype(value))


def iinfo(value):
    return np.iinfo(dtype(value))
