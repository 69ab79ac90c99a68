"""Sharded jit on 2, 4 and 8 virtual CPU devices equals one device. Each device count
runs in its own interpreter: TESSERA_CPU_DEVICES is read when the runtime starts."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import tessera as ts
    from tessera.sharding import NamedSharding, P

    n = ts.device_count()
    mesh = ts.make_mesh((2, n // 2), ("data", "model"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)

    def loss(w, x):
        return ts.mean(ts.tanh(x @ w) ** 2)

    step = lambda w, x: ts.value_and_grad(loss)(w, x)
    want_v, want_g = ts.jit(step)(ts.array(w), ts.array(x))
    xs = ts.device_put(x, NamedSharding(mesh, P("data", None)))
    ws = ts.device_put(w, NamedSharding(mesh, P(None, "model")))
    assert xs.sharding is not None and len(xs.addressable_shards) == n
    got_v, got_g = ts.jit(step)(ws, xs)
    np.testing.assert_allclose(np.asarray(got_v), np.asarray(want_v), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got_g), np.asarray(want_g), rtol=1e-5, atol=1e-6)

    # in_shardings / out_shardings and a constraint inside jit
    f = ts.jit(lambda a, b: ts.with_sharding_constraint(a @ b, NamedSharding(mesh, P("data", "model"))),
               in_shardings=(NamedSharding(mesh, P("data")), None), out_shardings=NamedSharding(mesh, P("data", "model")))
    out = f(ts.array(x), ts.array(w))
    assert out.sharding.spec == P("data", "model"), out.sharding
    np.testing.assert_allclose(np.asarray(out), x @ w, rtol=1e-5, atol=1e-5)
    text = f.lower(ts.array(x), ts.array(w)).text()
    assert "SPMD program" in text

    # bad layouts are errors that name what is wrong
    try:
        ts.device_put(np.zeros((3, 4), np.float32), NamedSharding(mesh, P("data")))
        raise AssertionError("uneven split accepted")
    except ValueError as e:
        assert "data" in str(e), e
    try:
        NamedSharding(mesh, P("nope")).resolve(2)
        raise AssertionError("unknown axis accepted")
    except ValueError as e:
        assert "nope" in str(e), e
    print("ok", n)
    """
)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_sharded_jit_equals_one_device(devices):
    env = dict(os.environ, TESSERA_CPU_DEVICES=str(devices))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"ok {devices}"


def test_make_mesh_needs_enough_devices():
    import tessera as ts

    with pytest.raises(ValueError, match="TESSERA_CPU_DEVICES"):
        ts.make_mesh((64, 64), ("a", "b"))
    with pytest.raises(TypeError, match="entry 0"):
        ts.P(3)


def test_sharding_objects_on_one_device():
    import tessera as ts

    mesh = ts.make_mesh((1,), ("data",))
    x = ts.device_put(ts.ones((4, 2)), ts.NamedSharding(mesh, ts.P("data")))
    assert isinstance(x.sharding, ts.sharding.Sharding) and x.sharding.spec == ts.P("data")
    assert x.sharding.shard_shape((4, 2)) == (4, 2)
    assert ts.NamedSharding(mesh, ts.P("data")).shard_shape((4, 2)) == (4, 2)
    with pytest.raises(ValueError, match="twice"):
        ts.NamedSharding(ts.Mesh((1, 1), ("a", "b")), ts.P("a", "a")).resolve(2)
    with pytest.raises(ValueError, match="1 axis sizes for 2 axis names"):
        ts.Mesh((1,), ("a", "b"))
