#!/usr/bin/env python3
"""Optax oracle for tessera's optimizers: writes tests/oracles/goldens/optax_optimizers.json.

A small parameter pytree (the shapes and kinds of a model's leaves) and a fixed
sequence of gradient pytrees (numpy default_rng, the exact values stored in the
golden so the C++ side needs no RNG) go through four steps of Optax's
adamw, lion and adafactor in float64 (jax_enable_x64), with a constant learning
rate; the params after every step are recorded.

Leaves and kinds (tessera's nn::ParamKind), chosen so each rule's branches run:
  emb         [6, 4]  embedding  no decay; Adafactor factors it (dims 4 and 6 >= 4)
  head        [3, 5]  weight     decays;   Adafactor keeps a full moment (3 < 4)
  layers.0.b  [4]     bias       no decay; 1-D: never factored
  layers.0.w  [4, 7]  weight     decays;   factored with the largest dim last
The weight-decay mask is tessera's default (OptimizerConfig::no_decay = norms,
biases, embeddings), i.e. decay exactly the 2-D "weight" leaves; it is stored per
leaf ("decay") and passed to Optax as `mask`.

Adafactor runs without weight decay (weight_decay_rate=None): Optax adds wd * p
after the learning rate and the parameter scale (p -= lr * rms(p) * u + wd * p),
tessera decays decoupled like AdamW (p -= lr * (rms(p) * u + wd * p)), so the two
are different rules by design and only the shared part is compared.

The first gradient has exact zeros (Lion's sign(0) = 0 at step 1, where the
momentum is 0 too); the gradient scales vary by 300x so AdamW's moments and
Adafactor's decayed second moments see both growing and shrinking gradients.

tests/optim/test_optim_optax_oracle.cpp runs tessera's Optimizer on the same
inputs and compares. Run through tests/oracles/run_oracle.sh optax_optimizers
(pinned venv, live diff against the committed golden); do not edit the golden by hand.

Usage: optax_optimizers.py OUT.json
"""
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

jax.config.update("jax_enable_x64", True)

GENERATOR = "tests/oracles/optax_optimizers.py"
STEPS = 4
GRAD_SCALES = [1.0, 0.3, 3.0, 0.01]

# (path, shape, kind); the decay mask follows tessera's default no_decay kinds.
LEAVES = [
    ("emb", (6, 4), "embedding"),
    ("head", (3, 5), "weight"),
    ("layers.0.b", (4,), "bias"),
    ("layers.0.w", (4, 7), "weight"),
]
NO_DECAY_KINDS = {"norm", "bias", "embedding"}


def decays(kind):
    return kind not in NO_DECAY_KINDS


def flat_tree(seed, scale):
    """{path: float64 array}: a flat dict pytree (Optax walks it in sorted-key order)."""
    rng = np.random.default_rng(seed)
    return {path: rng.standard_normal(shape) * scale for path, shape, _ in LEAVES}


def inputs():
    params = flat_tree(0, 1.0)
    grads = [flat_tree(100 + t, s) for t, s in enumerate(GRAD_SCALES)]
    grads[0]["layers.0.b"][1] = 0.0
    grads[0]["emb"][2, 3] = 0.0
    return params, grads


def optimizers(mask):
    """(name, optax transformation, learning rate, the settings tessera mirrors)."""
    lr = 0.01
    return [
        ("adamw", optax.adamw(lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=mask), lr,
         dict(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)),
        ("lion", optax.lion(lr, b1=0.9, b2=0.99, weight_decay=0.2, mask=mask), lr,
         dict(beta1=0.9, beta2=0.99, weight_decay=0.2)),
        ("adafactor",
         optax.adafactor(lr, min_dim_size_to_factor=4, decay_rate=0.8, clipping_threshold=1.0,
                         multiply_by_parameter_scale=True, weight_decay_rate=None, eps=1e-30), lr,
         dict(decay_rate=0.8, min_dim_to_factor=4, clip_threshold=1.0, param_scale=True, eps=1e-30,
              min_scale=1e-3, weight_decay=0.0)),
    ]


def run(tx, params, grads):
    params = {k: jnp.asarray(v, jnp.float64) for k, v in params.items()}
    state = tx.init(params)
    steps = []
    for g in grads:
        g = {k: jnp.asarray(v, jnp.float64) for k, v in g.items()}
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        for k, v in params.items():
            if v.dtype != jnp.float64:
                raise TypeError(f"{k} is {v.dtype} after a step (expected float64)")
        steps.append(flat(params))
    return steps


def adafactor_state_shapes(tx, params):
    """Optax's factored-moment shapes per leaf: v_row/v_col for a factored leaf, v for
    the others, [1] in the unused slots (tessera keeps 0-d there)."""
    state = tx.init({k: jnp.asarray(v, jnp.float64) for k, v in params.items()})
    factored = [s for s in jax.tree_util.tree_leaves(state, is_leaf=lambda x: hasattr(x, "v_row"))
                if hasattr(s, "v_row")]
    if len(factored) != 1:
        raise RuntimeError(f"expected one FactoredState in the adafactor state, found {len(factored)}")
    (s,) = factored
    return {path: dict(v=list(s.v[path].shape), v_row=list(s.v_row[path].shape), v_col=list(s.v_col[path].shape))
            for path, _, _ in LEAVES}


def flat(tree):
    return {path: np.asarray(tree[path], np.float64).ravel().tolist() for path, _, _ in LEAVES}


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
    params, grads = inputs()
    mask = {path: decays(kind) for path, _, kind in LEAVES}
    cases = []
    for name, tx, lr, config in optimizers(mask):
        case = dict(name=name, lr=lr, config=config)
        if name == "adafactor":
            case["state_shapes"] = adafactor_state_shapes(tx, params)
        case["params_after_step"] = run(tx, params, grads)
        cases.append(case)
    golden = {
        "generator": GENERATOR,
        "versions": {"optax": optax.__version__, "jax": jax.__version__, "jaxlib": jax.lib.__version__,
                     "numpy": np.__version__, "python": sys.version.split()[0]},
        "leaves": [dict(path=p, shape=list(s), kind=k, decay=decays(k)) for p, s, k in LEAVES],
        "params": flat(params),
        "grads": [flat(g) for g in grads],
        "cases": cases,
    }
    with open(sys.argv[1], "w") as f:
        f.write(fmt(golden) + "\n")
    print(f"optax_optimizers: {len(cases)} optimizers x {STEPS} steps -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
