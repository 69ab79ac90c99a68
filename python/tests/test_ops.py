"""Every binding of the ops against a NumPy float64 reference."""

import math

import numpy as np
import pytest

import tessera as ts


def check(got, want, rtol=1e-5, atol=1e-6):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


@pytest.fixture
def x(rng):
    return rng.standard_normal((3, 4)).astype(np.float32)


@pytest.fixture
def y(rng):
    return rng.standard_normal((3, 4)).astype(np.float32)


UNARY = {
    "negative": np.negative, "abs": np.abs, "absolute": np.abs, "sign": np.sign, "square": np.square,
    "exp": np.exp, "tanh": np.tanh, "sin": np.sin, "cos": np.cos, "stop_gradient": lambda v: v,
    "erf": np.vectorize(math.erf),
}
POSITIVE = {"log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v)}
BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "true_divide": np.divide, "maximum": np.maximum, "minimum": np.minimum,
}
COMPARE = {
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(x, name):
    check(getattr(ts, name)(x), UNARY[name](x.astype(np.float64)))


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_unary_positive(x, name):
    v = np.abs(x) + 0.1
    check(getattr(ts, name)(v), POSITIVE[name](v.astype(np.float64)))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting(x, y, name):
    check(getattr(ts, name)(x, y[0]), BINARY[name](x.astype(np.float64), y[0].astype(np.float64)))


def test_power(x, y):
    check(ts.power(np.abs(x) + 0.5, y), np.power(np.abs(x).astype(np.float64) + 0.5, y), rtol=1e-5)


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_comparisons(x, y, name):
    got = getattr(ts, name)(x, y)
    assert got.dtype == ts.bool_
    np.testing.assert_array_equal(np.asarray(got), COMPARE[name](x, y))


def test_logical_and_where(x, y):
    a, b = x > 0, y > 0
    np.testing.assert_array_equal(np.asarray(ts.logical_and(a, b)), a & b)
    np.testing.assert_array_equal(np.asarray(ts.logical_or(a, b)), a | b)
    np.testing.assert_array_equal(np.asarray(ts.logical_not(a)), ~a)
    check(ts.where(a, x, y), np.where(a, x, y))
    check(ts.where(a, x, 0.0), np.where(a, x, 0.0))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "var", "amax", "amin"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(x, name, axis, keepdims):
    ref = {"amax": np.max, "amin": np.min}.get(name, getattr(np, name))
    check(getattr(ts, name)(x, axis=axis, keepdims=keepdims), ref(x.astype(np.float64), axis=axis, keepdims=keepdims),
          rtol=2e-5)


def test_empty_axis_tuple_reduces_nothing(x):
    check(ts.sum(x, axis=()), x)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_argmax_argmin(x, axis):
    np.testing.assert_array_equal(np.asarray(ts.argmax(x, axis=axis)), np.argmax(x, axis=axis))
    np.testing.assert_array_equal(np.asarray(ts.argmin(x, axis=axis)), np.argmin(x, axis=axis))


def test_logsumexp(x):
    want = np.log(np.sum(np.exp(x.astype(np.float64)), axis=1))
    check(ts.logsumexp(x, axis=1), want)
    check(ts.nn.logsumexp(x, axis=1), want)


def test_creation():
    check(ts.zeros((2, 3)), np.zeros((2, 3)))
    check(ts.ones(4, dtype=ts.bfloat16), np.ones(4))
    assert ts.ones(4, dtype="bfloat16").dtype == ts.bfloat16
    check(ts.full((2,), 7.5), np.full(2, 7.5))
    check(ts.zeros_like(np.ones((2, 2), np.float32)), np.zeros((2, 2)))
    check(ts.ones_like(ts.zeros(3)), np.ones(3))
    check(ts.full_like(ts.zeros(3), 2.0), np.full(3, 2.0))
    check(ts.arange(5), np.arange(5))
    check(ts.arange(1, 7, 2), np.arange(1, 7, 2))
    check(ts.arange(0.0, 1.0, 0.25), np.arange(0.0, 1.0, 0.25))
    assert ts.arange(3).dtype == ts.int32 and ts.arange(0.5, 2).dtype == ts.float32


def test_linear_algebra(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 4, 5)).astype(np.float32)
    check(ts.matmul(a, b), a.astype(np.float64) @ b)
    check(ts.dot(a[0], b[0]), a[0].astype(np.float64) @ b[0])
    check(ts.outer(a[0, 0], b[0, 0]), np.outer(a[0, 0], b[0, 0]))
    check(ts.tensordot(a, b[0], axes=1), np.tensordot(a.astype(np.float64), b[0], axes=1))
    check(ts.dot_general(a, b, [2], [1], [0], [0]), np.einsum("bij,bjk->bik", a.astype(np.float64), b))
    for spec, ops in [("bij,bjk->bik", (a, b)), ("bij->bji", (a,)), ("bij,bjk->ik", (a, b)), ("ij->", (a[0],)),
                      ("bij,bkj->bik", (a, a)), ("i,i->", (a[0, 0], a[1, 0])), ("bij,bjk", (a, b))]:
        check(ts.einsum(spec, *ops), np.einsum(spec, *[o.astype(np.float64) for o in ops]), rtol=1e-4, atol=1e-5)


def test_layout(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    check(ts.reshape(a, (6, -1)), a.reshape(6, -1))
    check(ts.transpose(a), a.transpose())
    check(ts.transpose(a, (1, 0, 2)), a.transpose(1, 0, 2))
    check(ts.swapaxes(a, 0, 2), np.swapaxes(a, 0, 2))
    check(ts.moveaxis(a, 0, -1), np.moveaxis(a, 0, -1))
    check(ts.expand_dims(a, (0, 2)), np.expand_dims(a, (0, 2)))
    check(ts.squeeze(a[:1], 0), np.squeeze(a[:1], 0))
    check(ts.broadcast_to(a[0, 0], (3, 4)), np.broadcast_to(a[0, 0], (3, 4)))
    check(ts.concatenate([a, a], axis=1), np.concatenate([a, a], axis=1))
    check(ts.stack([a, a], axis=-1), np.stack([a, a], axis=-1))
    check(ts.ravel(a), a.ravel())


def test_indexing_ops(rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    idx = np.array([3, 0, 3], dtype=np.int32)
    check(ts.take(a, idx, axis=0), np.take(a, idx, axis=0))
    check(ts.take(a, idx), np.take(a, idx))
    along = rng.integers(0, 5, size=(4, 2)).astype(np.int32)
    check(ts.take_along_axis(a, along, axis=1), np.take_along_axis(a, along, axis=1))
    check(ts.nn.one_hot(np.array([0, 2]), 3), np.eye(3)[[0, 2]])


def softmax_ref(v, axis=-1):
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_nn_ops(rng, x):
    v = x.astype(np.float64)
    check(ts.nn.relu(x), np.maximum(v, 0))
    check(ts.nn.sigmoid(x), 1 / (1 + np.exp(-v)))
    check(ts.nn.silu(x), v / (1 + np.exp(-v)))
    check(ts.nn.gelu(x), 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))), rtol=1e-4)
    check(ts.nn.gelu(x, approximate=False), 0.5 * v * (1 + np.vectorize(math.erf)(v / np.sqrt(2))), rtol=1e-4)
    check(ts.nn.softmax(x, axis=0), softmax_ref(v, 0))
    check(ts.nn.log_softmax(x), np.log(softmax_ref(v)))
    w, b = rng.standard_normal(4), rng.standard_normal(4)
    mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
    check(ts.nn.layer_norm(x, w.astype(np.float32), b.astype(np.float32)), (v - mu) / np.sqrt(var + 1e-5) * w + b,
          rtol=1e-4, atol=1e-5)
    check(ts.nn.rms_norm(x, w.astype(np.float32)), v / np.sqrt((v**2).mean(-1, keepdims=True) + 1e-6) * w,
          rtol=1e-4, atol=1e-5)


def test_attention_and_cross_entropy(rng):
    q = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 5, 8)).astype(np.float32)
    v = rng.standard_normal((2, 1, 5, 8)).astype(np.float32)
    scores = np.einsum("bhtd,bhsd->bhts", q.astype(np.float64), np.repeat(k, 2, axis=1)) / np.sqrt(8)
    scores = np.where(np.tril(np.ones((5, 5), bool)), scores, -np.inf)
    want = np.einsum("bhts,bhsd->bhtd", softmax_ref(scores), np.repeat(v, 2, axis=1))
    check(ts.nn.scaled_dot_product_attention(q, k, v, causal=True), want, rtol=1e-4, atol=1e-5)
    logits = rng.standard_normal((6, 10)).astype(np.float32)
    targets = np.array([1, 2, 3, -100, 9, 0], dtype=np.int32)
    lp = np.log(softmax_ref(logits.astype(np.float64)))
    per = np.array([-lp[i, t] if t >= 0 else 0.0 for i, t in enumerate(targets)])
    check(ts.nn.cross_entropy(logits, targets), per.sum() / 5)
    check(ts.nn.cross_entropy(logits, targets, reduction="none"), per)
    check(ts.nn.cross_entropy(logits, targets, reduction="sum"), per.sum())
    with pytest.raises(ValueError, match="reduction"):
        ts.nn.cross_entropy(logits, targets, reduction="avg")


def test_random_is_deterministic_and_keyed():
    k = ts.random.key(0)
    a = np.asarray(ts.random.normal(k, (1000,)))
    assert np.array_equal(a, np.asarray(ts.random.normal(ts.random.key(0), (1000,))))
    assert abs(a.mean()) < 0.1 and abs(a.std() - 1) < 0.1
    k1, k2 = ts.random.split(k)
    assert not np.array_equal(np.asarray(ts.random.uniform(k1, (4,))), np.asarray(ts.random.uniform(k2, (4,))))
    u = np.asarray(ts.random.uniform(k1, (1000,), minval=2.0, maxval=3.0))
    assert u.min() >= 2.0 and u.max() < 3.0
    bern = np.asarray(ts.random.bernoulli(k, 0.25, (4000,)))
    assert bern.dtype == np.bool_ and 0.2 < bern.mean() < 0.3
    assert ts.random.split(k, 3).shape == (3, 2)
    assert ts.random.normal(k, (2,), dtype=ts.bfloat16).dtype == ts.bfloat16


def test_dtype_casts():
    a = ts.array([1.5, -2.5])
    assert ts.astype(a, ts.int32).dtype == ts.int32
    assert a.astype("bfloat16").dtype == ts.bfloat16
    assert ts.finfo(ts.bfloat16).bits == 16
    with pytest.raises(TypeError, match="no dtype"):
        ts.dtype(np.int16)


def test_numpy_composites(rng, x):
    v = x.astype(np.float64)
    check(ts.clip(x, -0.5, 0.5), np.clip(v, -0.5, 0.5))
    check(ts.clip(x, a_max=0.0), np.clip(v, None, 0.0))
    check(ts.std(x, axis=1), np.std(v, axis=1))
    check(ts.tan(x * 0.5), np.tan(v * 0.5), rtol=2e-5)
    special = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    np.testing.assert_array_equal(np.asarray(ts.isnan(special)), np.isnan(special))
    np.testing.assert_array_equal(np.asarray(ts.isinf(special)), np.isinf(special))
    np.testing.assert_array_equal(np.asarray(ts.isfinite(special)), np.isfinite(special))
    b = x > 0.5
    for axis in (None, 0, 1):
        np.testing.assert_array_equal(np.asarray(ts.any(b, axis=axis)), np.any(b, axis=axis))
        np.testing.assert_array_equal(np.asarray(ts.all(b, axis=axis)), np.all(b, axis=axis))
    check(ts.eye(3, 4, k=1), np.eye(3, 4, k=1))
    check(ts.tril(x), np.tril(x))
    check(ts.triu(x, k=1), np.triu(x, k=1))
    check(ts.flip(x, axis=1), np.flip(x, axis=1))
    check(ts.flip(x), np.flip(x))
    for got, want in zip(ts.split(x, 2, axis=1), np.split(x, 2, axis=1)):
        check(got, want)
    for got, want in zip(ts.split(x, [1, 3], axis=1), np.split(x, [1, 3], axis=1)):
        check(got, want)
    with pytest.raises(ValueError, match="equal sections"):
        ts.split(x, 3, axis=1)
    check(ts.repeat(x, 2, axis=0), np.repeat(x, 2, axis=0))
    check(ts.repeat(x, 3), np.repeat(x, 3))
    check(ts.tile(x, (2, 1)), np.tile(x, (2, 1)))
    check(ts.tile(x[0], 3), np.tile(x[0], 3))
    check(ts.pad(x, 1), np.pad(x, 1))
    check(ts.pad(x, ((0, 2), (1, 0)), constant_values=7.0), np.pad(x, ((0, 2), (1, 0)), constant_values=7.0))
    check(ts.nn.softplus(x * 30), np.logaddexp(0, v * 30), rtol=1e-5)
    check(ts.nn.log_sigmoid(x), -np.logaddexp(0, -v), rtol=1e-5)
    # they differentiate like any op
    g = ts.grad(lambda a: ts.sum(ts.nn.softplus(a) + ts.clip(a, -0.5, 0.5) * ts.tril(a)))(x)
    assert g.shape == x.shape
