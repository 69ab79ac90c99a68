"""tessera: JAX's programming model on tessera's C++ engine.

    import tessera as ts
    x = ts.array([[1.0, 2.0], [3.0, 4.0]])
    loss = lambda w: ts.sum(ts.tanh(x @ w) ** 2)
    g = ts.jit(ts.grad(loss))(ts.ones((2, 2)))

Arrays are lazy and immutable (tessera.Array); ops take NumPy's names and keywords
(tessera.exp, tessera.sum(a, axis=...)); tessera.nn and tessera.random hold the neural
network ops and the keyed random numbers; grad, value_and_grad, vjp, vmap, jit and
checkpoint transform Python functions over pytrees; tessera.sharding has Mesh, P and
NamedSharding. See docs/python.md.
"""

from . import _tessera

_mismatch = _tessera._cpu_mismatch_message()
if _mismatch:
    raise ImportError(_mismatch)

from . import _array_methods, _convert, _dtypes  # noqa: E402
from ._convert import array, asarray, from_dlpack  # noqa: E402
from ._dtypes import (  # noqa: E402
    bfloat16,
    bool_,
    dtype,
    finfo,
    float16,
    float32,
    float64,
    iinfo,
    int8,
    int32,
    int64,
    uint8,
    uint32,
)
from ._tessera import (  # noqa: E402
    Array,
    AxisError,
    ConfigError,
    DTypeError,
    Error,
    Lowered,
    ShapeError,
    ShardingError,
    TransformError,
    __version__,
    abs,
    absolute,
    add,
    amax,
    amin,
    arange,
    argmax,
    argmin,
    astype,
    broadcast_to,
    checkpoint_name,
    concatenate,
    cos,
    device_count,
    device_put,
    divide,
    dot_general,
    equal,
    erf,
    exp,
    expand_dims,
    full,
    full_like,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    logsumexp,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    moveaxis,
    multiply,
    negative,
    not_equal,
    num_threads,
    ones,
    ones_like,
    power,
    prod,
    ravel,
    reshape,
    rsqrt,
    sign,
    sin,
    sqrt,
    square,
    squeeze,
    stack,
    stop_gradient,
    subtract,
    sum,
    swapaxes,
    take,
    take_along_axis,
    tanh,
    transpose,
    true_divide,
    var,
    where,
    with_sharding_constraint,
    zeros,
    zeros_like,
)
from ._tessera import Tokenizer, clip_by_global_norm, global_norm, tokenizer  # noqa: E402
from . import checkpoints, compilation_cache, goodput, models, nn, optim, random, sharding, train, tree_util  # noqa: E402
from ._composites import (  # noqa: E402
    all,
    any,
    clip,
    eye,
    flip,
    isfinite,
    isinf,
    isnan,
    pad,
    repeat,
    split,
    std,
    tan,
    tile,
    tril,
    triu,
)
from ._linalg import dot, einsum, outer, tensordot  # noqa: E402
from ._transforms import checkpoint, checkpoint_policies, grad, jit, remat, value_and_grad, vjp, vmap  # noqa: E402
from .sharding import Mesh, NamedSharding, P, PartitionSpec, make_mesh  # noqa: E402

_array_methods.install()
_tessera._set_array_converter(_convert.array_from_object)


def info():
    """Prints what `tessera info` prints: version, threads, BLAS, CPU features, devices, CUDA."""
    print(_tessera.info_text(), end="")


def block_until_ready(tree):
    """Computes every array of a pytree (one pass over their shared graph) and returns it."""
    leaves = [l for l in tree_util.tree_leaves(tree) if isinstance(l, Array)]
    _tessera._eval(leaves)
    return tree


def to_numpy(a):
    """A read-only NumPy view of an array (no copy)."""
    return _convert.to_numpy(asarray(a))
