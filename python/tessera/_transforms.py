"""JAX's transforms over Python functions and pytrees, on tessera's C++ transforms.

Each transform flattens the arguments it acts on to a list of arrays, hands C++ a flat
function (list of arrays -> list of arrays) that rebuilds the pytrees and calls the user's
function, and rebuilds the results. The C++ side traces the function (tracers,
placeholders), so the transforms compose in any order: jit(grad(f)), vmap(grad(f)),
grad(grad(f)), grad(checkpoint(f)).
"""

import functools
import inspect
import threading

from . import _tessera as C
from ._convert import asarray
from ._tessera import Array
from .tree_util import _LEAF_DEF, broadcast_prefix, tree_flatten, tree_unflatten

__all__ = ["grad", "value_and_grad", "vjp", "vmap", "jit", "checkpoint", "remat", "checkpoint_policies"]


class _TraceState(threading.local):
    depth = 0  # how many transforms are tracing a function on this thread


_trace = _TraceState()


def _traced(fn):
    """fn (a flat function C++ traces) with the trace depth raised while it runs: a jitted
    function called inside another transform is inlined into that trace (JAX's rule),
    not run as a separate program on tracer values."""

    def inner(xs):
        _trace.depth += 1
        try:
            return fn(xs)
        finally:
            _trace.depth -= 1

    return inner


def _leaf_arrays(leaves, what):
    out = []
    for i, leaf in enumerate(leaves):
        if type(leaf) is Array:
            out.append(leaf)
            continue
        try:
            out.append(asarray(leaf))
        except TypeError as e:
            raise TypeError(f"{what}: leaf {i} is not an array or a number: {e}") from None
    return out


def _argnums_tuple(argnums, nargs, what):
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for n in nums:
        if not isinstance(n, int):
            raise TypeError(f"{what}: argnums must be ints, got {n!r}")
        if not -nargs <= n < nargs:
            raise ValueError(f"{what}: argnums {n} is out of range for a call with {nargs} positional argument(s)")
    return single, tuple(n % nargs for n in nums)


def value_and_grad(fun, argnums=0, has_aux=False):
    """f -> (value, gradient): the gradient of the scalar fun(*args) w.r.t. args[argnums]
    (an int: that argument's gradient; a tuple: a tuple of them), each with its argument's
    pytree structure. has_aux: fun returns (value, aux) and the result is ((value, aux), grad)."""

    @functools.wraps(fun)
    def value_and_grad_fun(*args, **kwargs):
        single, nums = _argnums_tuple(argnums, len(args), "value_and_grad")
        leaves, treedef = tree_flatten(tuple(args[i] for i in nums))
        arrays = _leaf_arrays(leaves, "grad: the differentiated arguments")
        aux_box = []

        def flat(xs):
            diff = tree_unflatten(treedef, xs)
            full = list(args)
            for k, i in enumerate(nums):
                full[i] = diff[k]
            out = fun(*full, **kwargs)
            if has_aux:
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise TypeError("grad with has_aux=True: the function must return a pair (value, aux)")
                out, aux = out
                aux_box.append(aux)
            if not isinstance(out, Array):
                out = asarray(out)
            return out

        value, grads = C._value_and_grad(_traced(flat), arrays)
        g = tree_unflatten(treedef, grads)
        g = g[0] if single else tuple(g)
        return ((value, aux_box[0]), g) if has_aux else (value, g)

    return value_and_grad_fun


def grad(fun, argnums=0, has_aux=False):
    """The gradient of a scalar function (jax.grad); see value_and_grad."""
    vg = value_and_grad(fun, argnums, has_aux)

    @functools.wraps(fun)
    def grad_fun(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return grad_fun


def vjp(fun, *primals, has_aux=False):
    """(fun(*primals), vjp_fn[, aux]): vjp_fn(cotangents) -> one cotangent per primal.

    The outputs are lazy; vjp_fn traces fun again with tracers (the two forward graphs are
    merged when both run in one compiled program)."""
    leaves, in_tree = tree_flatten(primals)
    arrays = _leaf_arrays(leaves, "vjp: the primals")
    box = {}

    def flat(xs):
        out = fun(*tree_unflatten(in_tree, xs))
        if has_aux:
            out, box["aux"] = out
        out_leaves, box["out_tree"] = tree_flatten(out)
        return _leaf_arrays(out_leaves, "vjp: the function's outputs")

    outs = flat(arrays)
    out_tree = box["out_tree"]

    def vjp_fn(cotangents):
        ct_leaves, ct_tree = tree_flatten(cotangents)
        if ct_tree != out_tree:
            raise ValueError(f"vjp: the cotangents have structure {ct_tree}, the outputs {out_tree}")
        _, grads = C._vjp(_traced(flat), arrays, _leaf_arrays(ct_leaves, "vjp: the cotangents"))
        return tuple(tree_unflatten(in_tree, grads))

    result = tree_unflatten(out_tree, outs)
    return (result, vjp_fn, box["aux"]) if has_aux else (result, vjp_fn)


def vmap(fun, in_axes=0, out_axes=0):
    """Vectorizes fun over an axis of its arguments (jax.vmap). in_axes / out_axes: an int,
    None (not mapped) or a pytree prefix of the arguments / results."""

    @functools.wraps(fun)
    def vmapped(*args):
        leaves, tree = tree_flatten(args)
        prefix = in_axes if not isinstance(in_axes, list) else tuple(in_axes)
        if isinstance(prefix, tuple) and len(prefix) != len(args):
            raise ValueError(f"vmap: in_axes has {len(prefix)} entries for {len(args)} positional arguments")
        axes = broadcast_prefix(prefix, args, "vmap in_axes")
        for a in axes:
            if a is not None and not isinstance(a, int):
                raise TypeError(f"vmap: in_axes entries must be ints or None, got {a!r}")
        if all(a is None for a in axes):
            raise ValueError("vmap: in_axes must map at least one argument (all are None)")
        arrays = _leaf_arrays(leaves, "vmap: the arguments")
        box = {}

        def flat(xs):
            out_leaves, box["out_tree"] = tree_flatten(fun(*tree_unflatten(tree, xs)))
            return _leaf_arrays(out_leaves, "vmap: the function's outputs")

        outs = C._vmap(_traced(flat), arrays, axes)
        out_tree = box["out_tree"]
        result = tree_unflatten(out_tree, outs)
        o_axes = broadcast_prefix(out_axes, result, "vmap out_axes")
        for i, a in enumerate(o_axes):
            if a is None:
                raise NotImplementedError("vmap: out_axes=None (an unbatched output) is not supported; use 0")
            if a != 0:
                outs[i] = C.moveaxis(outs[i], 0, a)
        return tree_unflatten(out_tree, outs)

    return vmapped


class _CheckpointPolicies:
    """JAX's names for the rematerialization policies (jax.checkpoint_policies)."""

    nothing_saveable = "full"  # recompute everything inside the region
    everything_saveable = "none"  # keep every intermediate

    @staticmethod
    def save_only_these_names(*names):
        return ("save_named", tuple(names))

    @staticmethod
    def offload_these_names(*names):
        """Keep the named values in host memory between the forward and backward pass
        (JAX's save_and_offload_only_these_names); recompute the rest."""
        return ("offload", tuple(names))


checkpoint_policies = _CheckpointPolicies()


def checkpoint(fun, policy="full"):
    """fun as a rematerialization region (jax.checkpoint): the backward pass recomputes its
    intermediates instead of keeping them. policy: "full" (nothing saved), "none" (all
    saved), checkpoint_policies.save_only_these_names("a", ...) (values tagged with
    tessera.checkpoint_name(x, "a") are kept) or checkpoint_policies.offload_these_names("a",
    ...) (they are kept in host memory until the backward pass reads them)."""
    if isinstance(policy, tuple):
        kind, names = policy
    elif policy in ("full", "none"):
        kind, names = policy, ()
    elif policy is None:
        kind, names = "full", ()
    else:
        raise ValueError(f"checkpoint: unknown policy {policy!r}")

    @functools.wraps(fun)
    def checkpointed(*args):
        leaves, tree = tree_flatten(args)
        arrays = _leaf_arrays(leaves, "checkpoint: the arguments")
        box = {}

        def flat(xs):
            out_leaves, box["out_tree"] = tree_flatten(fun(*tree_unflatten(tree, xs)))
            return _leaf_arrays(out_leaves, "checkpoint: the function's outputs")

        outs = C._checkpoint(_traced(flat), arrays, kind, list(names))
        return tree_unflatten(box["out_tree"], outs)

    return checkpointed


remat = checkpoint


class _Specialization:
    """One C++ Jitted for one argument structure and one set of static arguments."""

    __slots__ = ("jitted", "out_tree")

    def __init__(self):
        self.jitted = None
        self.out_tree = None


class Jitted:
    """A function compiled by tessera.jit. Calling it traces fun once per argument
    structure, static arguments and leaf shapes/dtypes, and runs the compiled program."""

    def __init__(self, fun, static_argnums, static_argnames, donate_argnums, in_shardings, out_shardings, device):
        self._fun = fun
        self._signature = _signature_or_none(fun)
        self._static_argnums = _int_tuple(static_argnums, "static_argnums")
        self._static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self._donate_argnums = _int_tuple(donate_argnums, "donate_argnums")
        self._in_shardings = in_shardings
        self._out_shardings = out_shardings
        self._device = device or "cpu"
        self._cache = {}
        # Calls whose arguments are all positional arrays (no static ones): the
        # specialization by argument count, found without flattening (the per-call cost
        # from Python is then a dict lookup, the C++ call and the result's rebuild).
        self._plain = not self._static_argnums and not self._static_argnames
        self._fast = {}
        functools.update_wrapper(self, fun)

    def _split(self, args, kwargs):
        statics = []
        dyn_args = []
        n = len(args)
        static_nums = {i % n for i in self._static_argnums if -n <= i < n} if n else set()
        for i, a in enumerate(args):
            if i in static_nums:
                statics.append(("#", i, _hashable(a, f"jit: static argument {i}")))
            else:
                dyn_args.append(a)
        dyn_kwargs = {}
        for k, v in kwargs.items():
            if k in self._static_argnames:
                statics.append(("=", k, _hashable(v, f"jit: static argument {k!r}")))
            else:
                dyn_kwargs[k] = v
        return tuple(statics), tuple(dyn_args), dyn_kwargs, static_nums

    def _specialize(self, key, tree, statics, static_nums, args, arrays, dyn_args):
        spec = _Specialization()
        static_positional = {i: v for tag, i, v in statics if tag == "#"}
        static_keywords = {k: v for tag, k, v in statics if tag == "="}
        nargs = len(args)
        fun = self._fun
        out_shardings = self._out_shardings

        def flat(xs):
            d_args, d_kwargs = tree_unflatten(tree, xs)
            it = iter(d_args)
            full = [static_positional[i] if i in static_positional else next(it) for i in range(nargs)]
            out = fun(*full, **d_kwargs, **static_keywords)
            if out_shardings is not None:
                from ._tessera import with_sharding_constraint

                out_leaves, out_tree = tree_flatten(out)
                shardings = broadcast_prefix(out_shardings, out, "jit out_shardings")
                out = tree_unflatten(
                    out_tree,
                    [l if s is None else with_sharding_constraint(asarray(l), s) for l, s in zip(out_leaves, shardings)],
                )
            out_leaves, spec.out_tree = tree_flatten(out)
            return _leaf_arrays(out_leaves, "jit: the function's outputs")

        # Donated leaves: the leaves of the donated positional arguments.
        donate = []
        offset = 0
        dyn_positions = [i for i in range(nargs) if i not in static_nums]
        for pos, a in zip(dyn_positions, dyn_args):
            count = tree_flatten(a)[1].num_leaves
            if pos in {d % nargs for d in self._donate_argnums if -nargs <= d < nargs}:
                donate.extend(range(offset, offset + count))
            offset += count
        in_shardings = []
        if self._in_shardings is not None:
            if isinstance(self._in_shardings, (tuple, list)) and len(self._in_shardings) != len(dyn_args):
                raise ValueError(
                    f"jit: in_shardings has {len(self._in_shardings)} entries for {len(dyn_args)} array arguments"
                )
            prefix = (tuple(self._in_shardings) if isinstance(self._in_shardings, (tuple, list)) else self._in_shardings, None)
            per_leaf = broadcast_prefix(prefix, (dyn_args, {}), "jit in_shardings")
            per_leaf = per_leaf + [None] * (len(arrays) - len(per_leaf))
            for i, (s, a) in enumerate(zip(per_leaf, arrays)):
                in_shardings.append(None if s is None else s.resolve(a.ndim, f"argument leaf {i}"))
        name = getattr(self._fun, "__name__", "main")
        spec.jitted = C._Jitted(_traced(flat), donate, in_shardings, [], self._device, name, "")
        self._cache[key] = spec
        return spec

    def _prepare(self, args, kwargs):
        statics, dyn_args, dyn_kwargs, static_nums = self._split(args, kwargs)
        leaves, tree = tree_flatten((dyn_args, dyn_kwargs))
        arrays = leaves if all(type(l) is Array for l in leaves) else _leaf_arrays(leaves, "jit: the arguments")
        key = (tree, statics, len(args))
        spec = self._cache.get(key)
        if spec is None:
            spec = self._specialize(key, tree, statics, static_nums, args, arrays, dyn_args)
        return spec, arrays

    def __call__(self, *args, **kwargs):
        if _trace.depth:
            return self._fun(*args, **kwargs)  # inside another transform's trace: inline
        if self._plain and not kwargs:
            spec = self._fast.get(len(args))
            if spec is not None and all(type(a) is Array for a in args):
                outs = spec.jitted(args)
                return outs[0] if spec.out_tree is _LEAF_DEF else tree_unflatten(spec.out_tree, outs)
        spec, arrays = self._prepare(args, kwargs)
        outs = spec.jitted(arrays)
        if self._plain and not kwargs and all(type(a) is Array for a in args):
            self._fast[len(args)] = spec
        return tree_unflatten(spec.out_tree, outs)

    def lower(self, *args, **kwargs):
        """The traced and compiled program for these arguments (.text(), .optimized_text())."""
        spec, arrays = self._prepare(args, kwargs)
        lowered = spec.jitted.lower(arrays)
        return lowered

    lowered = lower

    @property
    def trace_count(self):
        """How many times fun was traced (one per distinct signature)."""
        return sum(s.jitted.trace_count for s in self._cache.values())

    def profile_text(self):
        return "".join(s.jitted.profile_text() for s in self._cache.values())


def _signature_or_none(fun):
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def _int_tuple(value, what):
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    out = tuple(value)
    for v in out:
        if not isinstance(v, int):
            raise TypeError(f"jit: {what} must be ints, got {v!r}")
    return out


def _hashable(value, what):
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{what} must be hashable (it selects the compiled program); got a {type(value).__name__}: "
            "pass a tuple instead of a list, or make it a traced argument"
        ) from None
    return value


def jit(fun=None, *, static_argnums=(), static_argnames=(), donate_argnums=(), in_shardings=None,
        out_shardings=None, device=None):
    """Compiles fun (jax.jit): traced once per signature, optimized, and run as one program.

    static_argnums / static_argnames: arguments that select the program (hashable Python
    values, not traced). donate_argnums: arguments whose buffers the program may reuse
    for its outputs (do not read them after the call). in_shardings / out_shardings:
    NamedShardings (pytree prefixes of the arguments / results). device: "cpu" (default),
    "cuda" or "cuda:N". Usable as a decorator, with or without arguments."""
    if fun is None:
        return lambda f: jit(f, static_argnums=static_argnums, static_argnames=static_argnames,
                             donate_argnums=donate_argnums, in_shardings=in_shardings,
                             out_shardings=out_shardings, device=device)
    if not callable(fun):
        raise TypeError(f"jit: expected a function, got {type(fun).__name__}")
    return Jitted(fun, static_argnums, static_argnames, donate_argnums, in_shardings, out_shardings, device)
