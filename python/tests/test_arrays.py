"""tessera.Array: NumPy interchange (bitwise, every dtype), operators, indexing, errors."""

import ml_dtypes
import numpy as np
import pytest

import tessera as ts

ALL_DTYPES = [np.bool_, np.uint8, np.int8, np.uint32, np.int32, np.int64, np.float16, ml_dtypes.bfloat16,
              np.float32, np.float64]


def random_values(rng, dtype, shape):
    d = np.dtype(dtype)
    if d == np.bool_:
        return rng.random(shape) < 0.5
    if d.kind in "ui":
        info = np.iinfo(d)
        return rng.integers(info.min, info.max, size=shape, dtype=d, endpoint=True)
    # every bit pattern class: normals, subnormals, infinities, NaN, signed zeros
    values = (rng.standard_normal(shape) * 100).astype(d)
    flat = values.reshape(-1)
    if flat.size >= 6:
        flat[:6] = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-40], dtype=np.float64).astype(d)
    return values


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4)])
def test_numpy_round_trip_is_bitwise(rng, dtype, shape):
    values = random_values(rng, dtype, shape)
    a = ts.array(values)
    assert a.shape == shape
    assert a.dtype == np.dtype(dtype)
    back = np.asarray(a)
    assert back.dtype == np.dtype(dtype)
    assert back.shape == shape
    assert back.tobytes() == np.ascontiguousarray(values).tobytes()


def test_numpy_view_is_read_only_and_keeps_the_buffer_alive():
    a = ts.arange(6).astype(ts.float32) * 2.0
    view = np.asarray(a)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1
    del a
    np.testing.assert_array_equal(view, [0, 2, 4, 6, 8, 10])


def test_from_numpy_copies_so_later_writes_do_not_change_the_array():
    values = np.arange(4, dtype=np.float32)
    a = ts.array(values)
    values[0] = 100
    assert np.asarray(a)[0] == 0


def test_non_contiguous_input(rng):
    values = rng.standard_normal((6, 8)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(ts.array(values.T)), values.T)
    np.testing.assert_array_equal(np.asarray(ts.array(values[::2, 1::3])), values[::2, 1::3])


def test_dlpack_both_ways(rng):
    values = rng.standard_normal((3, 4)).astype(np.float32)
    a = ts.from_dlpack(values)
    np.testing.assert_array_equal(np.asarray(a), values)
    np.testing.assert_array_equal(np.from_dlpack(a), values)
    ints = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(np.from_dlpack(ts.array(ints)), ints)


def test_python_values_take_jax_defaults():
    assert ts.array([1.0, 2.0]).dtype == ts.float32
    assert ts.array([1, 2]).dtype == ts.int32
    assert ts.array([True, False]).dtype == ts.bool_
    assert ts.array(3.5).shape == ()
    assert ts.array([[1, 2]], dtype=ts.bfloat16).dtype == ts.bfloat16
    # NumPy arrays keep their dtype
    assert ts.array(np.zeros(2)).dtype == ts.float64


def test_unsupported_inputs_are_type_errors():
    with pytest.raises(TypeError, match="int16"):
        ts.array(np.zeros(3, dtype=np.int16))
    with pytest.raises(TypeError, match="complex128"):
        ts.array(np.zeros(3, dtype=np.complex128))
    with pytest.raises(TypeError, match="dict"):
        ts.array({"a": 1})
    with pytest.raises(ValueError, match="ragged"):
        ts.array([[1, 2], [3]])


def test_scalars_are_weakly_typed():
    x = ts.ones((2,), dtype=ts.bfloat16)
    assert (x * 2.0).dtype == ts.bfloat16
    assert (2.0 * x).dtype == ts.bfloat16
    assert (x + 1).dtype == ts.bfloat16
    i = ts.arange(3)
    assert (i + 1).dtype == ts.int32
    assert (i * 0.5).dtype == ts.float32
    assert (np.float32(2) * ts.ones(2)).dtype == ts.float32


def test_operators_match_numpy(rng):
    a_np = rng.standard_normal((3, 4)).astype(np.float32)
    b_np = rng.standard_normal((3, 4)).astype(np.float32) + 3
    a, b = ts.array(a_np), ts.array(b_np)
    cases = {
        "+": (a + b, a_np + b_np), "-": (a - b, a_np - b_np), "*": (a * b, a_np * b_np),
        "/": (a / b, a_np / b_np), "**": (abs(a) ** b, np.abs(a_np) ** b_np), "neg": (-a, -a_np),
        "@": (a @ b.T, a_np @ b_np.T), "r-": (1.5 - a, 1.5 - a_np), "r/": (2 / b, 2 / b_np),
        "T": (a.T, a_np.T), "<": (a < b, a_np < b_np), ">=": (a >= b, a_np >= b_np),
        "==": (a == a, a_np == a_np), "!=": (a != b, a_np != b_np),
        "&": ((a > 0) & (b > 3), (a_np > 0) & (b_np > 3)), "~": (~(a > 0), ~(a_np > 0)),
    }
    for name, (got, want) in cases.items():
        got = np.asarray(got)
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(
    "index",
    [0, -1, (1, 2), slice(1, 3), (slice(None), 1), (Ellipsis, 0), (None, 1), (slice(None, None, 2), None, slice(1, None)),
     (1, Ellipsis, None), (slice(5, 1),), np.array([2, 0, 2]), (slice(None), [1, 0])],
    ids=repr,
)
def test_indexing_matches_numpy(rng, index):
    values = rng.standard_normal((4, 5, 3)).astype(np.float32)
    got = np.asarray(ts.array(values)[index])
    want = values[index]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_indexing_errors():
    a = ts.zeros((2, 3))
    with pytest.raises(IndexError, match="out of bounds"):
        a[2]
    with pytest.raises(IndexError, match="too many indices"):
        a[0, 0, 0]
    with pytest.raises(IndexError, match="positive"):
        a[::-1]
    with pytest.raises(TypeError, match="immutable"):
        a[0] = 1.0


def test_properties_and_methods():
    a = ts.arange(6).reshape(2, 3)
    assert (a.ndim, a.size, a.shape, len(a)) == (2, 6, (2, 3), 2)
    assert a.dtype == ts.int32
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert int(a.sum()) == 15 and float(a.mean()) == 2.5
    assert a.T.shape == (3, 2)
    assert [r.tolist() for r in a] == [[0, 1, 2], [3, 4, 5]]
    assert a.astype(ts.float32).dtype == ts.float32
    assert "Array(" in repr(a) and "int32" in repr(a)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a)
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)


def test_numpy_functions_accept_arrays():
    a = ts.array([1.0, 2.0, 3.0])
    assert np.sum(a) == 6.0
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), [1, 2, 3])


def test_cpp_errors_become_python_exceptions_of_the_matching_kind():
    with pytest.raises(ValueError, match=r"shapes \[2, 3\] and \[4\] cannot be broadcast") as e:
        ts.add(ts.zeros((2, 3)), ts.zeros((4,)))
    assert isinstance(e.value, ts.ShapeError)
    with pytest.raises(IndexError) as e:
        ts.sum(ts.zeros((2, 3)), axis=5)
    assert isinstance(e.value, ts.AxisError) and isinstance(e.value, ValueError)
    with pytest.raises(TypeError):
        ts.zeros((2,), dtype="complex64")
    with pytest.raises(TypeError, match="x1"):
        ts.add(object(), 1.0)


def test_block_until_ready_and_info(capsys):
    tree = {"a": ts.ones(3) * 2, "b": [ts.zeros(2) + 1]}
    assert ts.block_until_ready(tree) is tree
    assert tree["a"].is_evaluated
    ts.info()
    out = capsys.readouterr().out
    assert out.startswith("tessera ") and "threads" in out and "devices" in out


def test_type_stubs_are_generated_and_declare_the_api():
    import ast
    import os

    stub_dir = os.path.join(os.path.dirname(ts.__file__), "_tessera")
    init = os.path.join(stub_dir, "__init__.pyi")
    tree = ast.parse(open(init).read())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"Array", "add", "matmul", "sum", "_Jitted", "Mesh", "NamedSharding", "ShapeError", "AxisError"} <= names
    array = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Array")
    methods = {n.name for n in array.body if isinstance(n, ast.FunctionDef)}
    assert {"__add__", "__matmul__", "__getitem__", "reshape", "sum", "dtype", "T", "item"} <= methods
    for sub in ("nn.pyi", "random.pyi", "_goodput.pyi"):
        ast.parse(open(os.path.join(stub_dir, sub)).read())
    assert os.path.exists(os.path.join(os.path.dirname(ts.__file__), "py.typed"))


def test_version_threads_and_error_classes():
    assert ts.__version__.count(".") == 2
    assert ts.num_threads() >= 1
    with pytest.raises(ts.DTypeError, match="integer class indices"):
        ts.nn.cross_entropy(ts.zeros((2, 3)), ts.zeros(2))
    with pytest.raises(TypeError, match="integer array"):
        ts.take(ts.zeros(3), ts.zeros(2), 0)
    for cls, bases in [(ts.Error, RuntimeError), (ts.ShardingError, ValueError), (ts.ConfigError, ValueError),
                       (ts.TransformError, TypeError), (ts.ShapeError, ValueError), (ts.DTypeError, TypeError)]:
        assert issubclass(cls, bases) and cls.__module__ == "tessera"
    with pytest.raises(TypeError, match="shape"):
        ts.zeros("abc")
    with pytest.raises(TypeError, match="axis"):
        ts.sum(ts.zeros(3), axis="x")


def _sum_of_doubled_range(n):
    return float(np.asarray((ts.arange(n).astype(ts.float32) * 2.0).sum()))


def test_a_forked_child_computes_on_workers_of_its_own():
    # fork() copies only the calling thread; the child used to wait forever for the
    # parent's pool workers on its first parallel op.
    import multiprocessing

    n = 1 << 20  # many chunks: the op runs on the pool
    expected = _sum_of_doubled_range(n)  # the parent's workers are running now
    with multiprocessing.get_context("fork").Pool(1) as workers:
        assert workers.apply_async(_sum_of_doubled_range, (n,)).get(timeout=60) == expected
    assert _sum_of_doubled_range(n) == expected


def test_small_aliases():
    x = ts.array([-1.0, 0.5])
    np.testing.assert_allclose(np.asarray(ts.nn.swish(x)), np.asarray(ts.nn.silu(x)))
    assert np.array_equal(np.asarray(ts.random.PRNGKey(3)), np.asarray(ts.random.key(3)))
    view = ts.to_numpy([1.0, 2.0])
    assert view.dtype == np.float32 and not view.flags.writeable
    assert isinstance(ts.tokenizer("byte"), ts.Tokenizer)
    assert "train.steps" in ts.train.config_keys()
    assert isinstance(ts.jit(lambda v: v + 1).lower(x), ts.Lowered)
    assert isinstance(ts.tree_util.tree_structure({"a": 1}), ts.tree_util.PyTreeDef)
    assert ts.sharding.PartitionSpec("a", None) == ts.P("a", None) == ts.PartitionSpec("a", None)
    assert repr(ts.P("a", ("b", "c"))) == "P('a', ('b', 'c'))"


@pytest.mark.parametrize("index", [1, (slice(1, 3),), (Ellipsis, 2), (0, slice(None)), (slice(None), slice(2, 5)),
                                   (-1, 4)], ids=repr)
def test_at_set_add_multiply_match_numpy(rng, index):
    x_np = rng.standard_normal((3, 6)).astype(np.float32)
    x = ts.array(x_np)
    region = x_np[index]
    value = rng.standard_normal(np.shape(region)).astype(np.float32)
    for how in ("set", "add", "multiply"):
        want = x_np.copy()
        if how == "set":
            want[index] = value
        elif how == "add":
            want[index] += value
        else:
            want[index] *= value
        got = getattr(x.at[index], how)(value)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=how)
    np.testing.assert_array_equal(np.asarray(x), x_np)  # the original is unchanged
    scalar = x_np.copy()
    scalar[index] = 2.5
    np.testing.assert_array_equal(np.asarray(x.at[index].set(2.5)), scalar)


def test_at_differentiates_and_refuses_what_it_cannot_do():
    x = ts.arange(6).astype(ts.float32)
    g = ts.grad(lambda v: ts.sum(v.at[1:3].set(0.0) * v))(x)
    np.testing.assert_array_equal(np.asarray(g), [0, 0, 0, 6, 8, 10])  # 2 v outside the zeroed region
    with pytest.raises(IndexError, match="step 1"):
        x.at[::2].set(0.0)
    with pytest.raises(IndexError, match="out of bounds"):
        x.at[6].set(0.0)
