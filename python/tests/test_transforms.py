"""grad / value_and_grad / vjp / vmap / jit / checkpoint over pytrees, composed."""

import collections

import numpy as np
import pytest

import tessera as ts
from tessera.tree_util import tree_flatten, tree_map, tree_paths, tree_structure, tree_unflatten

Pair = collections.namedtuple("Pair", ["a", "b"])

TREES = [
    1.0,
    None,
    (),
    [],
    {},
    (1, 2),
    [1, [2, (3, None)]],
    {"b": 1, "a": [2, 3]},
    Pair(1, {"x": 2}),
    {"layers": [{"w": 1, "b": 2}, {"w": 3, "b": 4}], "head": (5,)},
]


@pytest.mark.parametrize("tree", TREES, ids=repr)
def test_pytree_round_trip(tree):
    leaves, treedef = tree_flatten(tree)
    assert tree_unflatten(treedef, leaves) == tree
    assert tree_structure(tree) == treedef and hash(tree_structure(tree)) == hash(treedef)
    assert tree_map(lambda v: v, tree) == tree


def test_pytree_order_and_paths():
    tree = {"b": [1, 2], "a": {"y": 3, "x": 4}}
    assert tree_flatten(tree)[0] == [4, 3, 1, 2]
    assert tree_paths(tree) == ["a.x", "a.y", "b.0", "b.1"]
    with pytest.raises(ValueError, match="leaves"):
        tree_unflatten(tree_structure(tree), [1, 2])
    with pytest.raises(ValueError, match="structure"):
        tree_map(lambda u, v: u, {"a": 1}, {"b": 1})


def numeric_grad(f, x, eps=1e-3):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        g[i] = (float(f(up)) - float(f(down))) / (2 * eps)
    return g


def loss(params, x):
    h = ts.tanh(x @ params["w"] + params["b"])
    return ts.sum(h * h)


@pytest.fixture
def params(rng):
    return {"w": ts.array(rng.standard_normal((3, 2)).astype(np.float32)),
            "b": ts.array(rng.standard_normal(2).astype(np.float32))}


@pytest.fixture
def xs(rng):
    return ts.array(rng.standard_normal((4, 3)).astype(np.float32))


def test_grad_of_a_pytree_matches_finite_differences(params, xs):
    g = ts.grad(loss)(params, xs)
    assert set(g) == {"w", "b"} and g["w"].shape == (3, 2)
    w_np = np.asarray(params["w"]).astype(np.float64)
    num = numeric_grad(lambda w: loss({"w": ts.array(w), "b": params["b"].astype(ts.float64)}, xs.astype(ts.float64)),
                       w_np)
    np.testing.assert_allclose(np.asarray(g["w"]), num, rtol=1e-3, atol=1e-4)


def test_value_and_grad_argnums_and_aux(params, xs):
    def f(p, x):
        value = loss(p, x)
        return value, {"value_twice": value * 2}

    (value, aux), (gp, gx) = ts.value_and_grad(f, argnums=(0, 1), has_aux=True)(params, xs)
    assert float(aux["value_twice"]) == pytest.approx(2 * float(value))
    assert gx.shape == xs.shape and gp["b"].shape == (2,)
    np.testing.assert_allclose(np.asarray(ts.grad(loss, argnums=1)(params, xs)), np.asarray(gx), rtol=1e-6)
    g, aux2 = ts.grad(f, has_aux=True)(params, xs)
    assert set(g) == {"w", "b"} and "value_twice" in aux2


def test_grad_errors(params, xs):
    with pytest.raises(ts.TransformError):
        ts.grad(lambda x: x * 2)(xs)  # not a scalar
    with pytest.raises(TypeError):
        ts.grad(lambda i: ts.sum(i))(ts.arange(3))  # integer input
    with pytest.raises(ValueError, match="argnums 2 is out of range"):
        ts.grad(loss, argnums=2)(params, xs)
    with pytest.raises(TypeError, match="pair"):
        ts.grad(lambda x: ts.sum(x), has_aux=True)(xs)


def test_vjp(rng):
    x = ts.array(rng.standard_normal(5).astype(np.float32))
    out, vjp_fn = ts.vjp(lambda v: {"s": ts.sin(v), "c": v * 3}, x)
    (ct,) = vjp_fn({"s": ts.ones(5), "c": ts.ones(5)})
    np.testing.assert_allclose(np.asarray(ct), np.cos(np.asarray(x)) + 3, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["s"]), np.sin(np.asarray(x)), rtol=1e-6)
    with pytest.raises(ValueError, match="structure"):
        vjp_fn(ts.ones(5))


def test_vmap_in_axes_out_axes(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    got = ts.vmap(lambda row, m: row @ m, in_axes=(0, None))(a, w)
    np.testing.assert_allclose(np.asarray(got), a @ w, rtol=1e-5)
    got = ts.vmap(lambda col: col * 2, in_axes=1, out_axes=1)(a)
    np.testing.assert_allclose(np.asarray(got), a * 2)
    got = ts.vmap(lambda d: d["x"] + d["y"], in_axes=({"x": 0, "y": 1},))({"x": a, "y": a.T})
    np.testing.assert_allclose(np.asarray(got), a + a)
    with pytest.raises(ValueError, match="at least one"):
        ts.vmap(lambda v: v, in_axes=None)(a)
    with pytest.raises(ValueError, match="entries"):
        ts.vmap(lambda u, v: u, in_axes=(0,))(a, a)


def test_compositions(params, xs, rng):
    g_eager = ts.grad(loss)(params, xs)
    g_jit = ts.jit(ts.grad(loss))(params, xs)
    for k in ("w", "b"):
        np.testing.assert_allclose(np.asarray(g_jit[k]), np.asarray(g_eager[k]), rtol=1e-6, atol=1e-7)
    # per-example gradients: vmap(grad)
    per_example = ts.vmap(ts.grad(loss), in_axes=(None, 0))(params, ts.reshape(xs, (4, 1, 3)))
    np.testing.assert_allclose(np.asarray(ts.sum(per_example["w"], axis=0)), np.asarray(g_eager["w"]), rtol=1e-5,
                               atol=1e-6)
    # grad(grad): d2/dx2 sin(x) = -sin(x)
    x = ts.array(0.7)
    assert float(ts.grad(ts.grad(ts.sin))(x)) == pytest.approx(-np.sin(0.7), rel=1e-6)
    # grad(jit(f)) and jit(vmap(f))
    assert float(ts.grad(ts.jit(lambda v: ts.sin(v) * v))(x)) == pytest.approx(np.cos(0.7) * 0.7 + np.sin(0.7), rel=1e-6)
    m = ts.array(rng.standard_normal((3, 4)).astype(np.float32))
    np.testing.assert_allclose(np.asarray(ts.jit(ts.vmap(ts.nn.softmax))(m)), np.asarray(ts.nn.softmax(m)), rtol=1e-6)


def test_jit_caches_per_signature_and_static_args(xs):
    calls = []

    def f(x, power, *, scale):
        calls.append(1)
        return ts.sum(x**power) * scale

    jf = ts.jit(f, static_argnums=1)
    a = jf(xs, 2, scale=ts.array(1.0))
    b = jf(xs, 2, scale=ts.array(3.0))
    assert len(calls) == 1 and jf.trace_count == 1
    assert float(b) == pytest.approx(3 * float(a), rel=1e-6)
    jf(xs, 3, scale=ts.array(1.0))
    assert len(calls) == 2
    jf(ts.ones((2, 3)), 2, scale=ts.array(1.0))  # another shape re-traces
    assert len(calls) == 3
    js = ts.jit(f, static_argnames="scale")
    assert float(js(xs, 2, scale=2.0)) == pytest.approx(2 * float(a), rel=1e-6)
    with pytest.raises(TypeError, match="hashable"):
        ts.jit(lambda v, opts: v, static_argnums=1)(xs, [1, 2])


def test_jit_pytrees_in_and_out(params, xs):
    @ts.jit
    def step(p, x, lr):
        g = ts.grad(loss)(p, x)
        return tree_map(lambda w, d: w - lr * d, p, g), {"loss": loss(p, x)}

    new, metrics = step(params, xs, 0.1)
    assert set(new) == {"w", "b"} and metrics["loss"].shape == ()
    g = ts.grad(loss)(params, xs)
    np.testing.assert_allclose(np.asarray(new["w"]), np.asarray(params["w"]) - 0.1 * np.asarray(g["w"]), rtol=1e-6)


def test_jit_donation_gives_the_same_values(params, xs):
    def update(p, x):
        return tree_map(lambda w, d: w - 0.5 * d, p, ts.grad(loss)(p, x))

    want = ts.jit(update)(params, xs)
    copies = tree_map(lambda w: ts.array(np.array(w)), params)
    got = ts.jit(update, donate_argnums=0)(copies, xs)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))


def test_jit_lowered_text(xs):
    lowered = ts.jit(lambda v: ts.exp(v) + 1).lower(xs)
    assert "exp(" in lowered.text() and "f32[4, 3]" in lowered.text()
    assert lowered.optimized_text()


def test_reading_a_traced_value_inside_jit_names_the_op(xs):
    with pytest.raises(ts.TransformError, match="reduce_sum"):
        ts.jit(lambda v: ts.sum(v) if float(ts.sum(v)) > 0 else v)(xs)
    with pytest.raises(ts.TransformError):
        ts.jit(lambda v: np.asarray(v))(xs)


def test_jit_bad_inputs_name_the_argument(xs):
    with pytest.raises(TypeError, match="leaf 1"):
        ts.jit(lambda a, b: a)(xs, "text")
    with pytest.raises(TypeError, match="expected a function"):
        ts.jit(3)
    with pytest.raises(ValueError, match="structure"):
        ts.jit(lambda v: v)(xs).__class__ and ts.vjp(lambda v: v, xs)[1]((xs, xs))


def test_python_exceptions_inside_traced_functions_come_through(xs):
    def bad(v):
        raise KeyError("from the user")

    with pytest.raises(KeyError, match="from the user"):
        ts.jit(bad)(xs)
    with pytest.raises(KeyError):
        ts.grad(bad)(xs)


def test_checkpoint_gives_identical_values_and_gradients(params, xs):
    def block(p, x):
        return ts.tanh(x @ p["w"] + p["b"])

    def plain(p, x):
        return ts.sum(block(p, x) ** 2)

    for policy in ("full", "none", ts.checkpoint_policies.save_only_these_names("h")):
        def remat(p, x, policy=policy):
            return ts.sum(ts.checkpoint(block, policy=policy)(p, x) ** 2)

        g1 = ts.jit(ts.grad(plain))(params, xs)
        g2 = ts.jit(ts.grad(remat))(params, xs)
        for k in g1:
            np.testing.assert_array_equal(np.asarray(g1[k]), np.asarray(g2[k]))
    tagged = ts.checkpoint_name(xs, "h")
    np.testing.assert_array_equal(np.asarray(tagged), np.asarray(xs))


def test_persistent_compilation_cache_works_across_processes(tmp_path):
    import subprocess
    import sys

    script = (
        "import tessera as ts\n"
        f"ts.compilation_cache.set_dir({str(tmp_path)!r})\n"
        "f = ts.jit(lambda x: ts.tanh(x) * 2 + ts.sum(x))\n"
        "f(ts.ones((5, 3)))\n"
        "s = ts.compilation_cache.stats()\n"
        "print(s['hits'], s['misses'], s['stores'])\n"
    )
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split() == ["0", "1", "1"]  # compiled and stored
    assert runs[1].stdout.split() == ["1", "0", "0"]  # loaded by another process


def test_the_gil_is_released_while_a_program_runs():
    import threading
    import time

    big = ts.random.normal(ts.random.key(0), (768, 768))
    heavy = ts.jit(lambda a: ts.sum(((a @ a) @ a) @ a))
    heavy(big).block_until_ready()  # compiled
    counter = [0]
    done = threading.Event()

    def count():
        while not done.is_set():
            counter[0] += 1

    t = threading.Thread(target=count)
    t.start()
    start = time.perf_counter()
    before = counter[0]
    for _ in range(3):
        heavy(big).block_until_ready()
    during = counter[0] - before
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    # The counting thread ran while the programs ran: with the GIL held it would get only
    # the switch intervals between calls.
    assert during > 1000, (during, elapsed)


def test_ctrl_c_during_a_jitted_loop_raises_keyboard_interrupt():
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import tessera as ts, sys\n"
        "f = ts.jit(lambda a: ts.tanh(a @ a))\n"
        "x = ts.ones((256, 256))\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    while True:\n"
        "        f(x).block_until_ready()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted cleanly', flush=True)\n"
        "    sys.exit(3)\n"
    )
    # A background job (CI, nohup) starts with SIGINT ignored, and a Python started that way
    # keeps ignoring it: the child gets the default disposition, as a terminal's process has.
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, (out, err)
    assert "interrupted cleanly" in out
