#!/usr/bin/env python3
"""JAX oracle for tessera's core ops: writes tests/oracles/goldens/jax_core.json.

Every case evaluates one op in float64 on small fixed inputs (numpy
RandomState(seed), the exact values stored in the golden so the C++ side needs no
RNG), plus the gradient of the scalar loss sum(out * ct) w.r.t. every float
input, where ct is a fixed cotangent stored with the inputs. The hvp_* cases
have out = grad f(x), so their "grads" are Hessian-vector products (grad of grad).

tests/core/test_oracle_jax.cpp rebuilds each case with tessera ops and compares.
Run through tests/oracles/run_oracle.sh jax_core (pinned venv, live diff against
the committed golden); do not edit the golden by hand.

Usage: jax_core.py OUT.json
"""
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", True)

GENERATOR = "tests/oracles/jax_core.py"


# ---- inputs ----
def normal(seed, shape, scale=1.0):
    return np.random.RandomState(seed).standard_normal(shape) * scale


def uniform(seed, shape, lo, hi):
    return np.random.RandomState(seed).uniform(lo, hi, shape)


# ---- the ops, written with plain jnp so the reference is the textbook math ----
def layer_norm(x, w, b, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x * lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * w


def attention(q, k, v, causal=True):
    """q [B,H,T,D], k/v [B,Hkv,S,D]; query head h reads kv head h // (H/Hkv);
    causal is top-left aligned: query i sees keys j <= i."""
    h, hkv = q.shape[1], k.shape[1]
    k = jnp.repeat(k, h // hkv, axis=1)
    v = jnp.repeat(v, h // hkv, axis=1)
    s = jnp.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.shape[-1])
    if causal:
        t_len, s_len = q.shape[2], k.shape[2]
        visible = jnp.arange(s_len)[None, :] <= jnp.arange(t_len)[:, None]
        s = jnp.where(visible, s, -jnp.inf)
    return jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(s, axis=-1), v)


def cross_entropy_mean(logits, targets, ignore_index=-100):
    valid = targets != ignore_index
    safe = jnp.where(valid, targets, 0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.sum(valid)


def hvp_fn(f):
    """out = grad f(x); the generic loss sum(out * ct) then differentiates to H ct."""
    return jax.grad(f)


# Each case: name, description of the function, params (read by the C++ side),
# float inputs (differentiated), int inputs (not), and fn(**inputs) -> out.
def cases():
    x37 = normal(1, (3, 7), 2.0)
    c = []

    def add(name, fn, floats, ints=None, params=None, desc=""):
        c.append(dict(name=name, fn=fn, floats=floats, ints=ints or {}, params=params or {}, desc=desc))

    add("gelu_tanh", lambda x: jax.nn.gelu(x, approximate=True), {"x": x37},
        desc="0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))")
    add("gelu_erf", lambda x: jax.nn.gelu(x, approximate=False), {"x": x37}, desc="0.5 x (1 + erf(x / sqrt 2))")
    add("silu", jax.nn.silu, {"x": normal(2, (3, 7), 3.0)})
    add("sigmoid", jax.nn.sigmoid, {"x": normal(3, (3, 7), 4.0)})
    add("tanh", jnp.tanh, {"x": normal(4, (3, 7), 1.5)})
    add("erf", jax.scipy.special.erf, {"x": normal(5, (3, 7), 1.5)})
    add("log1p", jnp.log1p, {"x": uniform(6, (3, 7), -0.9, 3.0)})
    add("softmax_last", lambda x: jax.nn.softmax(x, axis=-1), {"x": normal(7, (3, 4, 6), 3.0)}, params={"axis": -1})
    add("softmax_axis1", lambda x: jax.nn.softmax(x, axis=1), {"x": normal(8, (3, 4, 6), 3.0)}, params={"axis": 1})
    # Large logits: the max-subtraction path matters (exp(60) alone is 1e26).
    add("log_softmax_last", lambda x: jax.nn.log_softmax(x, axis=-1), {"x": normal(9, (3, 4, 6), 30.0)},
        params={"axis": -1})
    add("logsumexp_axis1", lambda x: jax.nn.logsumexp(x, axis=1), {"x": normal(10, (3, 4, 6), 5.0)},
        params={"axes": [1], "keepdims": False})
    add("logsumexp_axes02_keepdims", lambda x: jax.nn.logsumexp(x, axis=(0, 2), keepdims=True),
        {"x": normal(11, (3, 4, 6), 5.0)}, params={"axes": [0, 2], "keepdims": True})
    add("layer_norm", lambda x, w, b: layer_norm(x, w, b, 1e-5),
        {"x": normal(12, (2, 3, 8), 2.0) + 0.5, "w": normal(13, (8,)), "b": normal(14, (8,))}, params={"eps": 1e-5},
        desc="(x - mean) / sqrt(biased var + eps) * w + b over the last axis")
    add("rms_norm", lambda x, w: rms_norm(x, w, 1e-6), {"x": normal(15, (2, 3, 8), 2.0), "w": normal(16, (8,))},
        params={"eps": 1e-6}, desc="x / sqrt(mean(x^2) + eps) * w over the last axis")
    add("matmul_broadcast_batch", jnp.matmul, {"a": normal(17, (2, 1, 3, 4)), "b": normal(18, (3, 4, 5))},
        desc="[2,1,3,4] @ [3,4,5] -> [2,3,3,5]")
    add("dot_general", lambda a, b: lax.dot_general(a, b, (((2, 3), (3, 0)), ((1,), (1,)))),
        {"a": normal(19, (3, 2, 4, 5)), "b": normal(20, (5, 2, 6, 4))},
        params={"a_contract": [2, 3], "b_contract": [3, 0], "a_batch": [1], "b_batch": [1]},
        desc="batch a1/b1, contract (a2,a3) with (b3,b0) -> [2, 3, 6]")
    add("attention_causal_gqa", attention,
        {"q": normal(21, (1, 4, 5, 8)), "k": normal(22, (1, 2, 5, 8)), "v": normal(23, (1, 2, 5, 8))},
        params={"causal": True}, desc="softmax(q k^T / sqrt(8), top-left causal) v; 4 query heads share 2 kv heads")
    add("attention_causal_gqa_t3_s6", attention,
        {"q": normal(24, (2, 4, 3, 8)), "k": normal(25, (2, 1, 6, 8)), "v": normal(26, (2, 1, 6, 8))},
        params={"causal": True}, desc="T=3 < S=6, top-left: query i sees keys 0..i; 4 query heads, 1 kv head")
    targets = np.random.RandomState(27).randint(0, 7, size=(2, 5))
    targets[0, 1] = targets[1, 3] = targets[1, 4] = -100
    add("cross_entropy_mean_ignore", cross_entropy_mean, {"logits": normal(28, (2, 5, 7), 3.0)},
        ints={"targets": targets}, params={"ignore_index": -100},
        desc="mean over targets != -100 of -log_softmax(logits)[target]")
    add("hvp_tanh_cubed", hvp_fn(lambda x: jnp.sum(jnp.tanh(x) ** 3)), {"x": normal(29, (11,), 1.5)},
        desc="out = grad sum(tanh(x)^3); grads = Hessian . ct (grad of grad)")
    add("hvp_softmax_dot", hvp_fn(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * jnp.asarray(normal(30, (2, 6))))),
        {"x": normal(31, (2, 6), 2.0)}, params={"weights": normal(30, (2, 6)).ravel().tolist()},
        desc="out = grad sum(softmax(x) * weights); grads = Hessian . ct")
    return c


def evaluate(case, ct_seed):
    names = list(case["floats"])
    floats = [jnp.asarray(case["floats"][n], dtype=jnp.float64) for n in names]
    ints = {n: jnp.asarray(v, dtype=jnp.int64) for n, v in case["ints"].items()}

    def by_position(*xs):
        return case["fn"](*xs, **ints)

    out = by_position(*floats)
    ct = np.asarray(normal(ct_seed, np.shape(out)))

    def loss(*xs):
        return jnp.sum(by_position(*xs) * ct)

    _, grads = jax.value_and_grad(loss, argnums=tuple(range(len(floats))))(*floats)
    tensor = lambda a: {"shape": list(np.shape(a)), "data": np.asarray(a).ravel().tolist()}
    inputs = {n: dict(tensor(case["floats"][n]), dtype="float64") for n in names}
    inputs.update({n: dict(tensor(v), dtype="int64") for n, v in case["ints"].items()})
    inputs["ct"] = dict(tensor(ct), dtype="float64")
    return {
        "name": case["name"],
        "description": case["desc"],
        "params": case["params"],
        "differentiate": names,
        "inputs": inputs,
        "output": tensor(out),
        "grads": {n: tensor(g) for n, g in zip(names, grads)},
    }


# ---- output: float64 with 17 significant digits (round-trips exactly) ----
def fmt(v, indent=0):
    pad = " " * indent
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = [f'{pad}  {json.dumps(k)}: {fmt(x, indent + 2)}' for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, (int, float, str)) for x in v):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return "[\n" + ",\n".join(pad + "  " + fmt(x, indent + 2) for x in v) + "\n" + pad + "]"
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    x = float(v)
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x} in golden")
    return format(x, ".17g") if x != int(x) or abs(x) >= 1e16 else f"{x:.1f}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    golden = {
        "generator": GENERATOR,
        "versions": {"jax": jax.__version__, "jaxlib": jax.lib.__version__, "numpy": np.__version__,
                     "python": sys.version.split()[0]},
        "loss": "sum(output * inputs.ct); grads are d loss / d input for each name in differentiate",
        "cases": [evaluate(c, 1000 + i) for i, c in enumerate(cases())],
    }
    with open(sys.argv[1], "w") as f:
        f.write(fmt(golden) + "\n")
    print(f"jax_core: {len(golden['cases'])} cases -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
