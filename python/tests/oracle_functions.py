"""The function set that JAX and tessera both run: each case is written ONCE, against an
adapter namespace `lib`, so the JAX oracle (tests/oracles/jax_python.py, which writes
tests/oracles/goldens/jax_python.json) and tessera's test (test_oracle_jax.py, which reads
it) evaluate literally the same Python code.

The adapter (jax_lib() / tessera_lib() below) has:
  lib.np          jax.numpy / tessera (NumPy's names: exp, sum(axis=, keepdims=), matmul...)
  lib.nn          jax.nn / tessera.nn (softmax, log_softmax, gelu, relu, silu, sigmoid, ...)
  lib.grad, lib.vmap, lib.jit, lib.stop_gradient, lib.erf, lib.rsqrt, lib.dot_general
  lib.layer_norm, lib.rms_norm, lib.attention, lib.cross_entropy
The last four are tessera's fused ops; JAX has no such op (or not in the [B,H,T,D] layout
with integer targets and ignore_index), so the JAX adapter spells out the textbook
composite, in float32 for bfloat16/float16 inputs, which is what tessera's fused kernels
compute (docs/dtypes.md: "fused NN ops compute in float32 for bf16/f16 inputs").

Every case is evaluated four ways (run_case): "out" = f(*inputs); "grad" = the gradient
of the scalar loss sum(f(*inputs).astype(f32) * w) (w a fixed weight tensor the shape of
the output, so that e.g. softmax, whose plain sum is constant, has a non-zero gradient)
w.r.t. every floating input; "vmap" = vmap(f) over a leading batch axis of BATCH; and
"vmap_grad" = vmap of that gradient. The test also runs "jit" (tessera.jit(f) against
JAX's "out"). Inputs come from numpy default_rng streams seeded per input, so both sides
build bit-identical arrays; input_digest() fingerprints them and the golden records it.

JAX is imported only inside jax_lib(): tessera's test never needs it.
"""

import hashlib
import math
from types import SimpleNamespace

import ml_dtypes
import numpy as np

BATCH = 3  # size of the vmapped leading axis
KINDS = ("out", "grad", "vmap", "vmap_grad")
FLOATS = ("float32", "bfloat16", "float16")


# ---------------------------------------------------------------------------- inputs
class Input:
    """One argument, drawn from its own stream: default_rng([seed, batched]) so the batched
    (vmap) version is an independent draw with BATCH leading rows."""

    def __init__(self, kind, seed, shape, dtype="float32", **kw):
        self.kind, self.seed, self.shape, self.dtype, self.kw = kind, seed, tuple(shape), dtype, kw

    def make(self, batched=False):
        shape = ((BATCH,) if batched else ()) + self.shape
        rng = np.random.default_rng([self.seed, int(batched)])
        kw = self.kw
        if self.kind == "normal":
            v = rng.standard_normal(shape) * kw.get("scale", 1.0) + kw.get("shift", 0.0)
            # gap: keep |v| >= gap, away from the kinks of relu/abs/sign (grads differ there).
            v = v + np.sign(v) * kw.get("gap", 0.0)
        elif self.kind == "uniform":
            v = rng.uniform(kw["lo"], kw["hi"], shape)
        elif self.kind == "ints":
            v = rng.integers(kw["lo"], kw["hi"], shape)
            if kw.get("ignore"):  # cross-entropy targets: some positions set to ignore_index
                v = np.where(rng.random(shape) < kw["ignore"], -100, v)
                v.reshape(-1)[0] = 1  # at least one valid target in every row block
        elif self.kind == "bool":
            v = rng.random(shape) < kw.get("p", 0.5)
        elif self.kind == "mask":  # an attention mask [..., T, S] whose diagonal always attends
            v = rng.random(shape) < 0.6
            t, s = shape[-2], shape[-1]
            v = v | (np.arange(s)[None, :] == np.arange(t)[:, None])
        else:
            raise ValueError(self.kind)
        if kw.get("round"):  # integer-valued floats: ties for max/maximum/argmax
            v = np.round(v)
        if kw.get("zeros"):  # exact zeros at this share of positions (log(0), relu'(0), abs'(0))
            v = np.where(rng.random(shape) < kw["zeros"], 0.0, v)
        if self.dtype == "bfloat16":
            return v.astype(np.float32).astype(ml_dtypes.bfloat16)
        return v.astype(self.dtype)


def N(seed, *shape, **kw):
    return Input("normal", seed, shape, **kw)


def U(seed, *shape, lo, hi, dtype="float32", **kw):
    return Input("uniform", seed, shape, dtype, lo=lo, hi=hi, **kw)


def I(seed, *shape, lo, hi, **kw):
    return Input("ints", seed, shape, "int32", lo=lo, hi=hi, **kw)


class Case:
    """name; fn(lib, *args); inputs (Input list); grad: differentiate the floating inputs
    (False for integer/bool outputs); vmap_axes: in_axes per input (None = shared, e.g.
    weights; default all 0). Tolerance (read by the test only): an element passes when
    |tessera - jax| <= k * eps * (|jax| + a * rms(jax)), eps that of the result's dtype,
    k = k32 for float32 results and k16 for bfloat16/float16; a is the share of the
    tensor's typical magnitude allowed as absolute slack (0.01 for elementwise maps,
    larger where terms cancel: reductions, matmul, normalization, 1 + erf(x) in gelu,
    1 - tanh(x)^2 in tanh's derivative); ag is a for the gradients when it differs.
    prec: a narrower dtype that float32 results pass through (the gradient of an f16
    softmax w.r.t. its f32 input): eps and k are that dtype's."""

    def __init__(self, name, fn, inputs, desc="", grad=True, vmap_axes=None, k32=8.0, k16=2.0, a=0.1, ag=None,
                 prec=None):
        self.name, self.fn, self.inputs, self.desc = name, fn, inputs, desc
        self.grad = grad
        self.vmap_axes = tuple(vmap_axes) if vmap_axes is not None else (0,) * len(inputs)
        self.k32, self.k16, self.a = k32, k16, a
        self.ag = a if ag is None else ag  # a for the gradients (grad, vmap_grad)
        self.prec = prec  # a float32 result computed through this narrower dtype gets its eps

    def kinds(self):
        return KINDS if self.grad else ("out", "vmap")

    def argnums(self):
        return tuple(i for i, s in enumerate(self.inputs) if s.dtype in FLOATS)


def input_digest(case):
    """sha256 (16 hex digits) of every input array, unbatched and batched: the golden keeps it
    so a NumPy whose generator stream changed is caught instead of compared."""
    h = hashlib.sha256()
    for spec in case.inputs:
        for batched in (False, True):
            v = np.ascontiguousarray(spec.make(batched))
            h.update(f"{v.dtype.name}{v.shape}".encode())
            h.update(v.tobytes())
    return h.hexdigest()[:16]


def loss_weights(shape):
    """w of the scalar loss sum(out * w): fixed by the output's shape alone."""
    return np.random.default_rng([4242, len(shape), *shape]).uniform(-1.0, 1.0, shape).astype(np.float32)


def run_case(lib, case, kind):
    """Evaluates one kind (KINDS, or "jit") of one case with lib; returns NumPy arrays."""
    args = [lib.asarray(s.make()) for s in case.inputs]
    f = lambda *xs: case.fn(lib, *xs)  # noqa: E731
    if kind in ("out", "jit"):
        return [np.asarray((lib.jit(f) if kind == "jit" else f)(*args))]
    batched = [lib.asarray(s.make(True)) if ax is not None else a
               for s, ax, a in zip(case.inputs, case.vmap_axes, args)]
    if kind == "vmap":
        return [np.asarray(lib.vmap(f, in_axes=case.vmap_axes)(*batched))]
    w = lib.asarray(loss_weights(np.shape(f(*args))))

    def loss(*xs):
        return lib.np.sum(f(*xs).astype(lib.np.float32) * w)

    g = lib.grad(loss, argnums=case.argnums())
    if kind == "grad":
        return [np.asarray(x) for x in g(*args)]
    if kind == "vmap_grad":
        return [np.asarray(x) for x in lib.vmap(g, in_axes=case.vmap_axes)(*batched)]
    raise ValueError(kind)


# ---------------------------------------------------------------------------- adapters
def tessera_lib():
    import tessera as ts

    return SimpleNamespace(
        name="tessera", np=ts, nn=ts.nn, grad=ts.grad, vmap=ts.vmap, jit=ts.jit, asarray=ts.asarray,
        stop_gradient=ts.stop_gradient, erf=ts.erf, rsqrt=ts.rsqrt, dot_general=ts.dot_general,
        layer_norm=lambda x, w=None, b=None, eps=1e-5: ts.nn.layer_norm(x, w, b, eps=eps),
        rms_norm=lambda x, w=None, eps=1e-6: ts.nn.rms_norm(x, w, eps=eps),
        attention=lambda q, k, v, causal=True, mask=None, scale=None: ts.nn.scaled_dot_product_attention(
            q, k, v, causal=causal, mask=mask, scale=scale),
        cross_entropy=lambda logits, targets, ignore_index=-100, reduction="mean": ts.nn.cross_entropy(
            logits, targets, ignore_index=ignore_index, reduction=reduction),
    )


def jax_lib():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def compute_dtype(x):
        # bf16/f16 inputs of the composites are computed in float32 and rounded once at the end
        return jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype

    def layer_norm(x, w=None, b=None, eps=1e-5):
        xf = x.astype(compute_dtype(x))
        mu = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)  # biased variance
        y = (xf - mu) * lax.rsqrt(var + eps)
        if w is not None:
            y = y * w.astype(xf.dtype)
        if b is not None:
            y = y + b.astype(xf.dtype)
        return y.astype(x.dtype)

    def rms_norm(x, w=None, eps=1e-6):
        xf = x.astype(compute_dtype(x))
        y = xf * lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
        if w is not None:
            y = y * w.astype(xf.dtype)
        return y.astype(x.dtype)

    def attention(q, k, v, causal=True, mask=None, scale=None):
        """q [B,H,T,D], k/v [B,Hkv,S,D]: query head h reads kv head h // (H/Hkv); causal is
        top-left aligned (query i sees keys j <= i); mask: bool, true = attend."""
        dt = compute_dtype(q)
        h, hkv = q.shape[1], k.shape[1]
        k = jnp.repeat(k.astype(dt), h // hkv, axis=1)
        v = jnp.repeat(v.astype(dt), h // hkv, axis=1)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        s = jnp.einsum("bhtd,bhsd->bhts", q.astype(dt), k) * scale
        if causal:
            t_len, s_len = q.shape[2], k.shape[2]
            s = jnp.where(jnp.arange(s_len)[None, :] <= jnp.arange(t_len)[:, None], s, -jnp.inf)
        if mask is not None:
            s = jnp.where(mask, s, -jnp.inf)
        return jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(s, axis=-1), v).astype(q.dtype)

    def cross_entropy(logits, targets, ignore_index=-100, reduction="mean"):
        """-log_softmax(logits)[target] over the last axis, 0 where target == ignore_index;
        mean = sum / count of the other targets. Computed (and returned) in float32."""
        logp = jax.nn.log_softmax(logits.astype(compute_dtype(logits)), axis=-1)
        valid = targets != ignore_index
        safe = jnp.where(valid, targets, 0)
        nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
        per = jnp.where(valid, nll, 0.0)
        if reduction == "none":
            return per
        if reduction == "sum":
            return jnp.sum(per)
        return jnp.sum(per) / jnp.sum(valid).astype(per.dtype)

    def dot_general(a, b, a_contract, b_contract, a_batch=(), b_batch=()):
        return lax.dot_general(a, b, ((tuple(a_contract), tuple(b_contract)), (tuple(a_batch), tuple(b_batch))))

    return SimpleNamespace(
        name="jax", np=jnp, nn=jax.nn, grad=jax.grad, vmap=jax.vmap, jit=jax.jit, asarray=jnp.asarray,
        stop_gradient=lax.stop_gradient, erf=jax.scipy.special.erf, rsqrt=lax.rsqrt, dot_general=dot_general,
        layer_norm=layer_norm, rms_norm=rms_norm, attention=attention, cross_entropy=cross_entropy,
    )


# ---------------------------------------------------------------------------- the cases
def _mlp_loss(L, x, w1, b1, w2, labels):
    """A two-layer MLP classifier's mean loss: the ops of a training step composed."""
    h = L.nn.gelu(L.np.matmul(x, w1) + b1, approximate=True)
    return L.cross_entropy(L.np.matmul(h, w2), labels)


def _block(L, x, wq, wkv, wo, g):
    """A pre-norm GQA attention block with a SiLU-gated residual: [T, C] -> [T, C], C = 4 heads
    of 4 (2 kv heads), built from reshape/transpose/einsum and the fused ops."""
    t = x.shape[0]
    h = L.rms_norm(x, g)
    q = L.np.transpose(L.np.reshape(L.np.matmul(h, wq), (1, t, 4, 4)), (0, 2, 1, 3))
    kv = L.np.reshape(L.np.matmul(h, wkv), (1, t, 2, 2, 4))
    k = L.np.transpose(kv[:, :, 0], (0, 2, 1, 3))
    v = L.np.transpose(kv[:, :, 1], (0, 2, 1, 3))
    o = L.np.reshape(L.np.transpose(L.attention(q, k, v, causal=True), (0, 2, 1, 3)), (t, 16))
    return x + L.nn.silu(L.np.einsum("tc,cd->td", o, wo))


def cases():
    c = []

    def add(*args, **kw):
        c.append(Case(*args, **kw))

    EW = dict(a=0.01)  # elementwise maps: the error is relative to each element
    RED = dict(k32=16.0, a=1.0)  # sums: the error scales with the terms, not the result

    # ---- elementwise (jnp.* / jax.nn.* / lax.*) ----
    add("exp", lambda L, x: L.np.exp(x), [N(1, 3, 5, scale=2.0)], **EW)
    add("log", lambda L, x: L.np.log(x), [U(2, 3, 5, lo=0.05, hi=5.0)], **EW)
    add("log1p", lambda L, x: L.np.log1p(x), [U(3, 3, 5, lo=-0.9, hi=3.0)], **EW)
    # tanh' = 1 - tanh^2 and sigmoid' = s (1 - s) cancel where they saturate: both libraries' float32
    # gradients are off by ~eps * |w| there, so their gradients get the tensor-scale slack (ag = 1).
    add("tanh", lambda L, x: L.np.tanh(x), [N(4, 3, 5, scale=1.5)], a=0.01, ag=1.0)
    add("sin", lambda L, x: L.np.sin(x), [N(5, 3, 5, scale=3.0)], a=0.1)  # zeros at k*pi: absolute slack
    add("cos", lambda L, x: L.np.cos(x), [N(6, 3, 5, scale=3.0)], a=0.1)
    add("erf", lambda L, x: L.erf(x), [N(7, 3, 5, scale=1.5)], **EW)
    add("sqrt", lambda L, x: L.np.sqrt(x), [U(8, 3, 5, lo=0.1, hi=4.0)], **EW)
    add("rsqrt", lambda L, x: L.rsqrt(x), [U(9, 3, 5, lo=0.1, hi=4.0)], **EW)
    add("power", lambda L, x, y: L.np.power(x, y), [U(10, 3, 5, lo=0.2, hi=3.0), N(11, 3, 5)],
        desc="x^y, both differentiated (d/dy = log(x) x^y)", a=0.05)
    add("power_int_exponent", lambda L, x: x ** 3 - 2 * x ** 2, [N(12, 3, 5, scale=1.5)],
        desc="integer exponents of negative bases (a weakly typed Python int)", a=0.05)
    add("maximum_broadcast", lambda L, x, y: L.np.maximum(x, y), [N(13, 3, 5), N(14, 5)],
        desc="y broadcast over rows: its gradient sums the rows it won", a=0.05)
    add("minimum", lambda L, x, y: L.np.minimum(x, y), [N(15, 3, 5), N(16, 3, 5)], **EW)
    add("where", lambda L, x, y: L.np.where(x > y, x * y, x - y), [N(17, 3, 5), N(18, 3, 5)], a=0.05)
    add("where_scalar_branch", lambda L, x: L.np.where(x > 0.3, x, 0.0), [N(19, 3, 5)], **EW)
    add("sigmoid", lambda L, x: L.nn.sigmoid(x), [N(20, 3, 5, scale=4.0)], a=0.01, ag=1.0)
    add("relu", lambda L, x: L.nn.relu(x), [N(21, 3, 5, gap=0.05)], **EW)
    # JAX's own float32 gradient of the tanh form is up to ~17 eps off the float64 value here (1 + tanh
    # cancels for negative x), hence k32 = 32 (tessera's is within 5).
    add("gelu_tanh", lambda L, x: L.nn.gelu(x, approximate=True), [N(22, 3, 5, scale=2.0)], k32=32.0, a=1.0)
    # 0.5 x (1 + erf(x / sqrt 2)) cancels for negative x: an absolute error ~eps * |x| in both libraries.
    add("gelu_erf", lambda L, x: L.nn.gelu(x, approximate=False), [N(23, 3, 5, scale=2.0)], a=1.0)
    add("silu", lambda L, x: L.nn.silu(x), [N(24, 3, 5, scale=3.0)], a=0.05)
    add("abs", lambda L, x: L.np.abs(x), [N(25, 3, 5, gap=0.05)], **EW)
    add("square", lambda L, x: L.np.square(x), [N(26, 3, 5)], **EW)
    add("sign_times_square", lambda L, x: L.np.sign(x) * L.np.square(x), [N(27, 3, 5, gap=0.05)], **EW)
    add("arithmetic", lambda L, x, y: -(x - y) / (1.0 + y * y) * 0.5 + x, [N(28, 3, 5), N(29, 3, 5)], a=0.1, ag=1.0)
    add("softplus_composite", lambda L, x: L.np.log1p(L.np.exp(-L.np.abs(x))) + L.np.maximum(x, 0.0),
        [N(30, 3, 5, scale=3.0, gap=0.01)], desc="the stable softplus, written with jnp ops", a=0.05)
    add("stop_gradient", lambda L, x: x * L.stop_gradient(x), [N(31, 3, 5)],
        desc="d/dx x * stop_gradient(x) = x (one factor is a constant)", **EW)

    # JAX's conventions at ties and kinks, and non-finite values.
    add("max_ties", lambda L, x: L.np.max(x, axis=-1), [N(32, 3, 5, round=True)],
        desc="integer-valued inputs: jax splits the gradient equally between tied maxima")
    add("maximum_ties", lambda L, x, y: L.np.maximum(x, y), [N(33, 3, 5, round=True), N(34, 3, 5, round=True)],
        desc="at x == y jax gives each operand half the gradient", **EW)
    add("relu_at_zero", lambda L, x: L.nn.relu(x), [N(35, 3, 5, zeros=0.4)], desc="jax: relu'(0) = 0", **EW)
    add("abs_at_zero", lambda L, x: L.np.abs(x), [N(164, 3, 5, zeros=0.4)],
        desc="jax: abs'(0) = +1 (lax.abs's rule is select(x >= 0, g, -g))", **EW)
    add("argmax_ties", lambda L, x: L.np.argmax(x, axis=-1), [N(36, 4, 5, round=True)], grad=False,
        desc="the first of tied maxima")
    add("log_of_zero", lambda L, x: L.np.log(x), [U(37, 3, 5, lo=0.1, hi=3.0, zeros=0.3)],
        desc="log(0) = -inf; its gradient w / 0 = +-inf", **EW)
    add("where_nan_gradient", lambda L, x: L.np.where(x > 0, L.np.sqrt(x), 0.0), [N(38, 3, 5)],
        desc="jax's where gotcha: the unselected sqrt(x < 0) branch gets cotangent 0, and 0 * (1 / (2 sqrt x)) "
             "= 0 * nan = nan in the gradient", **EW)

    # ---- reductions ----
    add("sum_axes_keepdims", lambda L, x: L.np.sum(x, axis=(0, 2), keepdims=True), [N(40, 2, 3, 4)], **RED)
    add("sum_all", lambda L, x: L.np.sum(x), [N(41, 3, 4)], **RED)
    add("mean_axis1", lambda L, x: L.np.mean(x, axis=1), [N(42, 2, 3, 4)], **RED)
    add("max_last", lambda L, x: L.np.max(x, axis=-1), [N(43, 2, 3, 4)], desc="grad flows to the argmax only")
    add("min_axis0_keepdims", lambda L, x: L.np.min(x, axis=0, keepdims=True), [N(44, 3, 4)])
    add("var_last", lambda L, x: L.np.var(x, axis=-1), [N(45, 2, 3, 5, shift=1.0)], desc="biased (ddof=0)", **RED)
    add("prod_axis1", lambda L, x: L.np.prod(x, axis=1), [U(46, 3, 4, lo=0.5, hi=1.5)], **RED)
    add("logsumexp_axes02", lambda L, x: L.nn.logsumexp(x, axis=(0, 2)), [N(47, 2, 3, 4, scale=5.0)], **RED)
    add("logsumexp_keepdims", lambda L, x: L.nn.logsumexp(x, axis=-1, keepdims=True), [N(48, 3, 6, scale=20.0)],
        desc="large logits: the max subtraction matters", **RED)
    add("argmax_axis1", lambda L, x: L.np.argmax(x, axis=1), [N(49, 3, 5, 2)], grad=False,
        desc="integer result: jnp gives int32 (x64 off)")

    add("bf16_sum_mean", lambda L, x: L.np.sum(x, axis=-1) + L.np.mean(x, axis=-1), [N(39, 3, 16, dtype="bfloat16")],
        desc="bf16 reductions stay bf16 (accumulated wider)", k16=2.0, a=1.0)

    # ---- matmul / einsum / dot_general / tensordot ----
    add("matmul_batch_broadcast", lambda L, a, b: L.np.matmul(a, b), [N(50, 2, 1, 3, 4), N(51, 3, 4, 5)],
        desc="[2,1,3,4] @ [3,4,5] -> [2,3,3,5]", **RED)
    add("matmul_vector", lambda L, v, m: v @ m, [N(52, 4), N(53, 4, 3)], desc="1-D @ 2-D", vmap_axes=(0, None),
        **RED)
    add("einsum_bmm", lambda L, a, b: L.np.einsum("bij,bjk->bik", a, b), [N(54, 2, 3, 4), N(55, 2, 4, 2)], **RED)
    add("einsum_scores", lambda L, q, k: L.np.einsum("bhtd,bhsd->bhts", q, k), [N(56, 1, 2, 3, 4), N(57, 1, 2, 5, 4)],
        **RED)
    add("einsum_chain_reduce", lambda L, a, b, d: L.np.einsum("ij,jk,kl->l", a, b, d),
        [N(58, 2, 3), N(59, 3, 4), N(60, 4, 2)], desc="three operands, i summed away", **RED)
    add("dot_general", lambda L, a, b: L.dot_general(a, b, (2, 3), (3, 0), (1,), (1,)),
        [N(61, 3, 2, 4, 2), N(62, 2, 2, 3, 4)], desc="batch a1/b1, contract (a2,a3) with (b3,b0)", **RED)
    add("tensordot", lambda L, a, b: L.np.tensordot(a, b, axes=([1, 2], [0, 1])), [N(63, 2, 3, 4), N(64, 3, 4, 2)],
        **RED)
    add("outer", lambda L, a, b: L.np.outer(a, b), [N(65, 4), N(66, 3)], **EW)

    # ---- softmax / norms / attention / losses (jax.nn or the composites in jax_lib) ----
    add("softmax_last", lambda L, x: L.nn.softmax(x, axis=-1), [N(70, 2, 3, 5, scale=3.0)], **RED)
    add("softmax_axis0", lambda L, x: L.nn.softmax(x, axis=0), [N(71, 3, 2, 4, scale=3.0)], **RED)
    add("log_softmax_large", lambda L, x: L.nn.log_softmax(x, axis=-1), [N(72, 3, 6, scale=30.0)], **RED)
    add("layer_norm", lambda L, x, w, b: L.layer_norm(x, w, b), [N(73, 2, 3, 8, scale=2.0, shift=0.5), N(74, 8),
                                                                N(75, 8)], vmap_axes=(0, None, None), **RED)
    add("layer_norm_no_affine", lambda L, x: L.layer_norm(x, eps=1e-3), [N(76, 3, 8, scale=0.2)], **RED)
    add("rms_norm", lambda L, x, w: L.rms_norm(x, w), [N(77, 2, 3, 8, scale=2.0), N(78, 8)], vmap_axes=(0, None),
        **RED)
    add("attention_causal", lambda L, q, k, v: L.attention(q, k, v, causal=True),
        [N(80, 1, 2, 5, 8), N(81, 1, 2, 5, 8), N(82, 1, 2, 5, 8)], **RED)
    add("attention_full", lambda L, q, k, v: L.attention(q, k, v, causal=False),
        [N(83, 2, 2, 4, 4), N(84, 2, 2, 6, 4), N(85, 2, 2, 6, 4)], desc="no mask, T=4 queries over S=6 keys", **RED)
    add("attention_causal_gqa", lambda L, q, k, v: L.attention(q, k, v, causal=True),
        [N(86, 1, 4, 5, 4), N(87, 1, 2, 5, 4), N(88, 1, 2, 5, 4)], desc="4 query heads share 2 kv heads", **RED)
    add("attention_causal_t3_s6", lambda L, q, k, v: L.attention(q, k, v, causal=True),
        [N(89, 1, 2, 3, 4), N(90, 1, 1, 6, 4), N(91, 1, 1, 6, 4)], desc="T < S, top-left causal, MQA", **RED)
    add("attention_mask_scale", lambda L, q, k, v, m: L.attention(q, k, v, causal=False, mask=m, scale=0.3),
        [N(92, 1, 2, 4, 4), N(93, 1, 2, 4, 4), N(94, 1, 2, 4, 4), Input("mask", 95, (1, 1, 4, 4), "bool")],
        desc="a bool mask (true = attend) and an explicit scale", vmap_axes=(0, 0, 0, None), **RED)
    add("cross_entropy_mean_ignore", lambda L, z, t: L.cross_entropy(z, t),
        [N(96, 2, 5, 7, scale=3.0), I(97, 2, 5, lo=0, hi=7, ignore=0.3)], desc="mean over targets != -100", **RED)
    add("cross_entropy_none", lambda L, z, t: L.cross_entropy(z, t, reduction="none"),
        [N(98, 6, 5, scale=3.0), I(99, 6, lo=0, hi=5, ignore=0.3)], **RED)
    add("cross_entropy_sum_ignore7", lambda L, z, t: L.cross_entropy(z, t, ignore_index=7, reduction="sum"),
        [N(100, 6, 8, scale=3.0), I(101, 6, lo=0, hi=8)], desc="ignore_index=7 (a real class id)", **RED)
    add("one_hot", lambda L, t: L.nn.one_hot(t, 6), [I(102, 2, 4, lo=0, hi=6)], grad=False)
    add("mlp_loss", _mlp_loss, [N(103, 4, 6), N(104, 6, 8, scale=0.5), N(105, 8, scale=0.1), N(106, 8, 5, scale=0.5),
                                I(107, 4, lo=0, hi=5)], vmap_axes=(0, None, None, None, 0), k32=32.0, a=1.0)
    add("attention_block", _block, [N(108, 5, 16), N(109, 16, 16, scale=0.3), N(110, 16, 16, scale=0.3),
                                     N(111, 16, 16, scale=0.3), N(112, 16, shift=1.0, scale=0.1)],
        desc="rms_norm -> q/kv projections -> GQA causal attention -> out projection -> silu + residual",
        vmap_axes=(0, None, None, None, None), k32=32.0, a=1.0)

    # ---- transforms inside the function: higher order, nested vmap, jit inlined ----
    add("grad_of_tanh_cubed", lambda L, x: L.grad(lambda u: L.np.sum(L.np.tanh(u) ** 3))(x), [N(113, 3, 4, scale=1.5)],
        desc="out is a gradient; grad is a Hessian-vector product (grad of grad)", k32=16.0, a=1.0)
    add("grad_of_softmax_dot", lambda L, x, v: L.grad(lambda u: L.np.sum(L.nn.softmax(u, axis=-1) * v))(x),
        [N(114, 2, 5, scale=2.0), N(115, 2, 5)], desc="second order through softmax, mixed partials w.r.t. v",
        k32=16.0, a=1.0)
    add("nested_vmap", lambda L, x, y: L.vmap(lambda a, b: L.np.sum(a * L.nn.sigmoid(b)))(x, y),
        [N(116, 4, 5), N(117, 4, 5)], desc="vmap inside the function (vmap of vmap in the vmap case)", **RED)
    add("jit_inside", lambda L, x, w: L.jit(lambda a, b: L.np.tanh(a @ b))(x, w) * 2.0, [N(118, 3, 4), N(119, 4, 2)],
        desc="a jitted function called inside grad / vmap (inlined into their trace)", vmap_axes=(0, None), **RED)

    # ---- dtype control: casts, low precision, promotion ----
    add("astype_bf16", lambda L, x: x.astype(L.np.bfloat16), [N(120, 3, 5)],
        desc="round to nearest even; the f32 cotangent is rounded through bf16 on the way back")
    add("astype_f16", lambda L, x: L.np.astype(x, L.np.float16), [N(121, 3, 5, scale=100.0)])
    add("astype_f32_to_int32", lambda L, x: x.astype(L.np.int32), [N(122, 3, 5, scale=4.0)], grad=False,
        desc="truncation toward zero")
    add("bf16_exp", lambda L, x: L.np.exp(x), [N(123, 3, 5, dtype="bfloat16")], desc="bf16 in, bf16 out")
    add("bf16_matmul", lambda L, a, b: a @ b, [N(124, 3, 8, dtype="bfloat16"), N(125, 8, 4, dtype="bfloat16")],
        k16=2.0, a=1.0)
    add("bf16_layer_norm", lambda L, x, w, b: L.layer_norm(x, w, b),
        [N(126, 3, 8, dtype="bfloat16"), N(127, 8, dtype="bfloat16"), N(128, 8, dtype="bfloat16")],
        vmap_axes=(0, None, None), k16=2.0, a=1.0)
    add("f16_softmax", lambda L, x: L.nn.softmax(x.astype(L.np.float16), axis=-1), [N(129, 3, 6, scale=3.0)],
        desc="f32 input cast to f16 inside; jax runs the backward in f16 arithmetic (tessera in f32, rounded once)",
        k16=8.0, a=1.0, prec="float16")
    add("bf16_cross_entropy", lambda L, z, t: L.cross_entropy(z, t),
        [N(130, 4, 6, scale=3.0, dtype="bfloat16"), I(131, 4, lo=0, hi=6)], desc="bf16 logits, float32 loss", **RED)
    add("bf16_attention", lambda L, q, k, v: L.attention(q, k, v),
        [N(132, 1, 2, 4, 8, dtype="bfloat16"), N(133, 1, 2, 4, 8, dtype="bfloat16"),
         N(134, 1, 2, 4, 8, dtype="bfloat16")], k16=2.0, a=1.0)
    add("bf16_weak_scalar", lambda L, x: x * 3.0 + 1, [N(135, 3, 5, dtype="bfloat16")],
        desc="Python scalars are weakly typed: stays bf16", k16=2.0, a=0.1)
    add("promote_bf16_f32", lambda L, x, y: x * y + x, [N(136, 3, 5, dtype="bfloat16"), N(137, 3, 5)],
        desc="bf16 with f32 -> f32", a=0.1)
    add("promote_bf16_f16", lambda L, x, y: x + y, [N(138, 3, 5, dtype="bfloat16"), N(139, 3, 5, dtype="float16")],
        desc="bf16 with f16 -> f32", **EW)
    add("promote_int_f32", lambda L, i, x: i * x + 2.5, [I(140, 3, 5, lo=-4, hi=5), N(141, 3, 5)],
        desc="int32 with f32 -> f32; only x is differentiated", **EW)
    add("int_transcendental", lambda L, i: L.np.exp(i * 0.25) + L.np.sqrt(i), [I(142, 3, 5, lo=0, hi=9)], grad=False,
        desc="int32 * 0.25 (weak float) -> f32; sqrt(int32) -> f32", **EW)
    add("mean_int", lambda L, i: L.np.mean(i, axis=0), [I(143, 4, 5, lo=-50, hi=50)], grad=False,
        desc="mean of int32 -> f32", **EW)
    add("sum_int", lambda L, i: L.np.sum(i, axis=1), [I(144, 3, 5, lo=-50, hi=50)], grad=False,
        desc="sum of int32: jnp keeps int32 (x64 off)")
    add("true_divide_int", lambda L, i, j: i / j, [I(145, 3, 5, lo=-9, hi=10), I(146, 3, 5, lo=1, hi=5)],
        grad=False, desc="int32 / int32 is true division in jnp: f32", **EW)
    add("bool_mask_arith", lambda L, b, x: L.np.where(b, x, -x) + b.astype(L.np.float32) * x,
        [Input("bool", 147, (3, 5), "bool"), N(148, 3, 5)], **EW)

    # ---- layout: reshape / transpose / concatenate / stack / take / slicing ----
    add("reshape_transpose", lambda L, x: L.np.transpose(L.np.reshape(x, (2, 6, 2)), (2, 0, 1)), [N(150, 4, 6)], **EW)
    add("concatenate", lambda L, x, y: L.np.concatenate([x, y * 2.0, x], axis=1), [N(151, 2, 3), N(152, 2, 4)], **EW)
    add("stack", lambda L, x, y: L.np.stack([x, y], axis=-1), [N(153, 3, 4), N(154, 3, 4)], **EW)
    add("take_axis1", lambda L, x, i: L.np.take(x, i, axis=1), [N(155, 3, 5), I(156, 4, lo=0, hi=5)],
        desc="repeated indices: their gradients add up", **EW)
    add("take_along_axis", lambda L, x, i: L.np.take_along_axis(x, i, axis=1), [N(157, 3, 5), I(158, 3, 4, lo=0, hi=5)],
        **EW)
    add("int_array_index", lambda L, x, i: x[i], [N(159, 4, 3), I(160, 5, lo=0, hi=4)], desc="x[idx]: gather on axis 0",
        **EW)
    add("basic_slicing", lambda L, x: x[1:, ::2, None] * x[..., :1][:1, 1:4, None], [N(161, 3, 5, 2)],
        desc="slices with steps, None, Ellipsis, broadcasting", **EW)
    add("axes_shuffle", lambda L, x: L.np.squeeze(L.np.expand_dims(L.np.moveaxis(L.np.swapaxes(x, 0, 2), 0, 1), 0), 0),
        [N(162, 2, 3, 4)], **EW)
    add("broadcast_to", lambda L, x: L.np.broadcast_to(x, (3, 2, 4)) * 1.5, [N(163, 2, 1)],
        desc="its gradient sums the broadcast copies", **EW)
    return c
