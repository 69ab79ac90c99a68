#!/usr/bin/env python3
"""Reference for tessera's SPMD partitioner: which collectives XLA's partitioner inserts, and how
many bytes each device sends, for a few sharded programs on 8 CPU host devices.

For every case we jax.jit the function with explicit in_shardings / out_shardings (NamedSharding
on a jax.sharding.Mesh), lower and compile it (nothing is executed), and parse the optimized HLO
text (`compiled.as_text()`) for collectives. Each case is compiled a second time with out_shardings
left unspecified, to record the output sharding XLA picks.

    ~/.cache/tessera-peers-venv/bin/python bench/spmd/xla_collectives.py            # table + JSON
    ... xla_collectives.py --check      # recompute and compare with the golden JSON (exit 1 on a diff)
    ... xla_collectives.py --hlo-dir D  # also write each case's optimized HLO to D/<case>.hlo.txt

Bytes per device use the ring-algorithm counts (n = replica-group size):
  all-gather          (n-1)/n * result bytes
  reduce-scatter      (n-1)/n * operand bytes
  all-reduce          2(n-1)/n * operand bytes   (a reduce-scatter followed by an all-gather)
  all-to-all          (n-1)/n * operand bytes
  collective-permute  operand bytes
A tuple-shaped (combined) collective is one entry whose bytes are the sum over its tuple elements.
Async pairs (`*-start` / `*-done`) are counted once, at the start; `*-done` is ignored.
"""

import os

# Must be set before jax is imported: 8 virtual CPU devices.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import datetime  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from fractions import Fraction  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

NUM_DEVICES = 8
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xla_collectives.json")

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
ELEMENT_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
    "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1,
}

# ---------------------------------------------------------------------------------------------
# HLO text parsing
# ---------------------------------------------------------------------------------------------


def _match_close(s, i):
    """Index of the bracket closing s[i] (one of ( [ {), honouring nesting of all three kinds."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for j in range(i, len(s)):
        c = s[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                raise ValueError(f"unbalanced brackets in HLO text near: {s[i:i + 80]!r}")
            if not stack:
                return j
    raise ValueError(f"unclosed bracket in HLO text near: {s[i:i + 80]!r}")


_ARRAY_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")


def parse_shapes(shape_text):
    """'f32[2,3]{1,0}' or '(f32[], s32[4]{0})' -> [('f32', (2, 3))] / [('f32', ()), ('s32', (4,))].
    Layouts ({1,0}) and tuple nesting are dropped; token[] and other non-array types are skipped."""
    out = []
    for m in _ARRAY_SHAPE.finditer(shape_text):
        dtype = m.group(1)
        if dtype not in ELEMENT_BYTES:
            continue
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        out.append((dtype, dims))
    return out


def shape_bytes(shapes):
    return sum(ELEMENT_BYTES[dt] * math.prod(dims) for dt, dims in shapes)


def shape_str(dtype, dims):
    return f"{dtype}[{','.join(str(d) for d in dims)}]"


def parse_instructions(hlo_text):
    """Every instruction line of the module -> dict(name, shape_text, opcode, operands, attrs)."""
    hlo_text = re.sub(r"/\*.*?\*/", "", hlo_text)  # /*index=5*/ comments inside long tuples
    instrs = []
    for line in hlo_text.splitlines():
        m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$", line)
        if not m or line.lstrip().startswith(("HloModule", "ENTRY", "//")):
            continue
        name, rest = m.group(1), m.group(2)
        if rest.startswith("("):
            end = _match_close(rest, 0)
            shape_text, rest = rest[: end + 1], rest[end + 1:].lstrip()
        else:
            sp = rest.find(" ")
            if sp < 0:
                continue
            shape_text, rest = rest[:sp], rest[sp + 1:].lstrip()
        om = re.match(r"([\w\-]+)\(", rest)
        if not om:
            continue
        opcode = om.group(1)
        close = _match_close(rest, om.end() - 1)
        operand_text = rest[om.end(): close]
        attrs = rest[close + 1:]
        operands = re.findall(r"%([\w.\-]+)", operand_text)
        instrs.append(dict(name=name, shape_text=shape_text, opcode=opcode, operands=operands,
                           attrs=attrs))
    return instrs


def _attr_value(attrs, key):
    """Raw text of `key=<value>` in an attribute list, with balanced brackets; None if absent."""
    m = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", attrs)
    if not m:
        return None
    i = m.end()
    if attrs[i] in "{[(":
        j = _match_close(attrs, i)
        # iota form: [4,2]<=[2,4]T(1,0)
        if attrs[i] == "[" and attrs.startswith("<=", j + 1):
            j = _match_close(attrs, j + 3)
            if attrs.startswith("T(", j + 1):
                j = _match_close(attrs, j + 2)
        return attrs[i: j + 1]
    if attrs.startswith("mesh[", i):
        # mesh axes form: mesh['a'=2,'b'=4] {'b'}
        j = _match_close(attrs, i + 4)
        k = attrs.index("{", j)
        return attrs[i: _match_close(attrs, k) + 1]
    m2 = re.match(r"[^,\s]+", attrs[i:])
    return m2.group(0) if m2 else ""


def _int_list(text):
    return [int(v) for v in re.findall(r"-?\d+", text)]


def expand_replica_groups(text, num_devices):
    """replica_groups attribute text -> list of device-id lists. Handles
    {} (one group of every device), {{0,1},{2,3}}, the iota form [G,S]<=[d0,d1,...]T(perm), and
    the mesh-axes form mesh['a'=2,'b'=4(, device_ids=(...))] {'a', 'b':(1)2}."""
    text = text.strip()
    if text == "{}":
        return [list(range(num_devices))]
    if text.startswith("{"):
        return [_int_list(g) for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
    m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if m:
        groups_shape = _int_list(m.group(1))
        reshape = _int_list(m.group(2))
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(3):
            ids = ids.transpose(_int_list(m.group(3)))
        return ids.reshape(groups_shape[0], -1).tolist()
    m = re.fullmatch(r"mesh\[(.*)\]\s*\{(.*)\}", text, re.S)
    if m:
        return _expand_mesh_axes_groups(m.group(1), m.group(2))
    raise ValueError(f"unrecognised replica_groups syntax: {text!r}")


def _expand_mesh_axes_groups(mesh_text, axes_text):
    """Devices grouped along the listed mesh axes, like XLA's MeshAxesReplicaGroupList. A
    sub-axis 'a':(p)s is Shardy's: the s-sized factor of axis a that has p positions of a to
    its major side, i.e. axis a (size S, row-major) viewed as [p, s, S/(p*s)], middle factor.
    Each mesh axis is split at every sub-axis boundary, the grouped factors are moved to the
    back (in the listed order, each major first), and the device array is cut into rows."""
    dev_ids = None
    dm = re.search(r",\s*device_ids=\((.*)\)\s*$", mesh_text, re.S)
    if dm:
        dev_ids = _int_list(dm.group(1))
        mesh_text = mesh_text[: dm.start()]
    names, sizes = [], []
    for nm, sz in re.findall(r"'?([\w.\-]+)'?\s*=\s*(\d+)", mesh_text):
        names.append(nm)
        sizes.append(int(sz))
    refs = []  # (mesh axis index, pre_size, size)
    for am in re.finditer(r"'?([\w.\-]+)'?(?::\((\d+)\)(\d+))?", axes_text):
        a = names.index(am.group(1))
        refs.append((a, int(am.group(2)), int(am.group(3))) if am.group(2) else (a, 1, sizes[a]))
    # factors[k] = (mesh axis, pre-size at its major edge, size), in row-major order of the
    # split device array: axes in mesh order, and within an axis ascending pre-size (major first).
    factors = []
    for a, full in enumerate(sizes):
        cuts = sorted({1, full} | {p for ax, p, _ in refs if ax == a} | {p * s for ax, p, s in refs if ax == a})
        factors += [(a, lo, hi // lo) for lo, hi in zip(cuts, cuts[1:])]
    ids = np.array(dev_ids if dev_ids is not None else range(math.prod(sizes)))
    ids = ids.reshape([f[2] for f in factors])
    grouped = []
    for a, p, s in refs:
        grouped += [k for k, (ax, lo, _) in enumerate(factors) if ax == a and p <= lo < p * s]
    rest = [k for k in range(len(factors)) if k not in grouped]
    group_size = math.prod(factors[k][2] for k in grouped)
    return ids.transpose(rest + grouped).reshape(-1, group_size).tolist()


def _self_test():
    """The replica-group and instruction parsers on hand-checked inputs (runs every time; cheap)."""
    cases = {
        "{}": [list(range(8))],
        "{{0,1},{2,3},{4,5},{6,7}}": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "[2,4]<=[8]": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "[4,2]<=[2,4]T(1,0)": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "mesh['axis_0'=8,'axis_1'=1] {'axis_0'}": [list(range(8))],
        "mesh['axis_0'=1,'axis_1'=8] {'axis_1'}": [list(range(8))],
        "mesh['a'=2,'b'=4] {'b'}": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "mesh['a'=2,'b'=4] {'a'}": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "mesh['a'=2,'b'=4] {'b','a'}": [[0, 4, 1, 5, 2, 6, 3, 7]],
        "mesh['a'=8] {'a':(1)2}": [[0, 4], [1, 5], [2, 6], [3, 7]],  # XLA: [8]->[1,2,4], group dim 1
        "mesh['a'=8] {'a':(4)2}": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "mesh['a'=8] {'a':(1)2,'a':(4)2}": [[0, 1, 4, 5], [2, 3, 6, 7]],  # [2,2,2], group dims 0,2
        "mesh['a'=2,'b'=4, device_ids=(0,2,4,6,1,3,5,7)] {'b'}": [[0, 2, 4, 6], [1, 3, 5, 7]],
    }
    for text, want in cases.items():
        got = expand_replica_groups(text, 8)
        assert got == want, f"replica_groups {text!r}: got {got}, want {want}"
        attrs = f", channel_id=1, replica_groups={text}, use_global_device_ids=true"
        assert _attr_value(attrs, "replica_groups") == text, (_attr_value(attrs, "replica_groups"), text)
    ins = parse_instructions(
        "  %ar = (f32[], f32[512]{0}, /*index=2*/bf16[4,8]{1,0}) all-reduce(%a, %b, %c), "
        "channel_id=5, replica_groups=[1,8]<=[8], to_apply=%add")
    assert len(ins) == 1 and ins[0]["opcode"] == "all-reduce" and ins[0]["operands"] == ["a", "b", "c"], ins
    assert parse_shapes(ins[0]["shape_text"]) == [("f32", ()), ("f32", (512,)), ("bf16", (4, 8))]
    assert shape_bytes(parse_shapes(ins[0]["shape_text"])) == 4 + 2048 + 64


def mesh_axes_of_groups(groups, mesh):
    """Which axes of the case's mesh a set of replica groups runs along (e.g. ['model']); None if
    the groups are not the rows of any subset of mesh axes. Device id i = mesh.devices.flat[i]."""
    want = sorted(sorted(g) for g in groups)
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    axes = list(mesh.axis_names)
    for r in range(1, len(axes) + 1):
        for subset in itertools.combinations(range(len(axes)), r):
            rest = [k for k in range(len(axes)) if k not in subset]
            size = math.prod(ids.shape[k] for k in subset)
            rows = ids.transpose(rest + list(subset)).reshape(-1, size)
            if sorted(sorted(row) for row in rows.tolist()) == want:
                return [axes[k] for k in subset]
    return None


def _num(x):
    """Fraction -> int when whole, else float (JSON)."""
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def collectives_from_hlo(hlo_text, mesh):
    instrs = parse_instructions(hlo_text)
    by_name = {ins["name"]: ins for ins in instrs}
    done_of = {}  # start name -> its *-done instruction
    for ins in instrs:
        if ins["opcode"].endswith("-done") and ins["operands"]:
            done_of[ins["operands"][0]] = ins
    out = []
    for ins in instrs:
        op = ins["opcode"]
        kind = op[: -len("-start")] if op.endswith("-start") else op
        if kind not in COLLECTIVES:
            continue
        operand_shapes = []
        for o in ins["operands"]:
            if o not in by_name:
                raise ValueError(f"operand %{o} of %{ins['name']} ({op}) not found in the module")
            operand_shapes += parse_shapes(by_name[o]["shape_text"])
        result_text = ins["shape_text"]
        if op.endswith("-start"):
            if ins["name"] not in done_of:
                raise ValueError(f"%{ins['name']} ({op}) has no matching -done")
            result_text = done_of[ins["name"]]["shape_text"]
        result_shapes = parse_shapes(result_text)

        groups, pairs = None, None
        if kind == "collective-permute":
            pairs = [_int_list(p) for p in re.findall(r"\{(\d+,\d+)\}", _attr_value(ins["attrs"], "source_target_pairs") or "")]
            n = None
            sent = Fraction(shape_bytes(operand_shapes))
        else:
            rg = _attr_value(ins["attrs"], "replica_groups")
            groups = expand_replica_groups(rg if rg is not None else "{}", NUM_DEVICES)
            sizes = {len(g) for g in groups}
            if len(sizes) != 1:
                raise ValueError(f"%{ins['name']}: replica groups of unequal sizes {groups}")
            n = sizes.pop()
            f = Fraction(n - 1, n)
            if kind == "all-gather":
                sent = f * shape_bytes(result_shapes)
                if shape_bytes(result_shapes) != n * shape_bytes(operand_shapes):
                    raise ValueError(f"%{ins['name']}: all-gather result is not n x operand")
            elif kind == "reduce-scatter":
                sent = f * shape_bytes(operand_shapes)
            elif kind == "all-reduce":
                sent = 2 * f * shape_bytes(operand_shapes)
            else:  # all-to-all
                sent = f * shape_bytes(operand_shapes)
        dtypes = sorted({dt for dt, _ in result_shapes + operand_shapes})
        dims_attr = _attr_value(ins["attrs"], "dimensions")
        entry = dict(
            kind=kind,
            shape=(shape_str(*result_shapes[0]) if len(result_shapes) == 1
                   else "(" + ", ".join(shape_str(*s) for s in result_shapes) + ")"),
            dtype=",".join(dtypes),
            tuple_size=len(result_shapes),
            operand_shapes=[shape_str(*s) for s in operand_shapes],
            result_shapes=[shape_str(*s) for s in result_shapes],
            dimensions=_int_list(dims_attr) if dims_attr is not None else None,
            group_size=n,
            replica_groups=groups,
            mesh_axes=mesh_axes_of_groups(groups, mesh) if groups is not None else None,
            source_target_pairs=pairs,
            is_async=op.endswith("-start"),
            bytes_per_device=_num(sent),
        )
        out.append({k: v for k, v in entry.items() if v is not None})
    return out


def totals_of(colls):
    totals = {}
    for c in colls:
        t = totals.setdefault(c["kind"], dict(count=0, bytes_per_device=Fraction(0)))
        t["count"] += 1
        t["bytes_per_device"] += Fraction(c["bytes_per_device"])
    totals = {k: dict(count=v["count"], bytes_per_device=_num(v["bytes_per_device"]))
              for k, v in sorted(totals.items())}
    total = _num(sum((Fraction(c["bytes_per_device"]) for c in colls), Fraction(0)))
    return totals, total


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


def make_mesh(shape, names):
    return Mesh(np.array(jax.devices()[: math.prod(shape)]).reshape(shape), names)


def spec_json(spec, rank):
    """PartitionSpec -> JSON list padded with null to the array's rank: P('data') on a matrix ->
    ['data', null]; an entry sharded over several axes becomes a list of them."""
    entries = list(spec) + [None] * (rank - len(spec))
    return [list(e) if isinstance(e, tuple) else e for e in entries]


def sharding_json(sharding, rank):
    if isinstance(sharding, NamedSharding):
        return spec_json(sharding.spec, rank)
    return str(sharding)  # not expected: JAX returns NamedSharding for NamedSharding inputs


def matmul_case(out_spec):
    mesh = make_mesh((2, 4), ("data", "model"))
    x = jax.ShapeDtypeStruct((8192, 8192), jnp.float32)
    return dict(
        mesh=mesh,
        fn=lambda x: x @ x.T,
        args=(x,),
        in_shardings=(NamedSharding(mesh, P("data", "model")),),
        out_shardings=NamedSharding(mesh, out_spec),
        in_names=("x",),
        out_names="y",
    )


def mlp_loss(params, x):
    h = jax.nn.gelu(x @ params["w1"] + params["b1"], approximate=True)
    y = h @ params["w2"] + params["b2"]
    return jnp.mean(y ** 2)


MLP_SHAPES = dict(x=(256, 512), w1=(512, 2048), b1=(2048,), w2=(2048, 512), b2=(512,))
PARAMS = ("w1", "b1", "w2", "b2")


def mlp_case(axis, x_spec, param_specs):
    mesh = make_mesh((8,), (axis,))
    params = {k: jax.ShapeDtypeStruct(MLP_SHAPES[k], jnp.float32) for k in PARAMS}
    x = jax.ShapeDtypeStruct(MLP_SHAPES["x"], jnp.float32)
    ps = {k: NamedSharding(mesh, param_specs[k]) for k in PARAMS}
    return dict(
        mesh=mesh,
        fn=jax.value_and_grad(mlp_loss),  # -> (loss, {w1, b1, w2, b2} grads)
        args=(params, x),
        in_shardings=(ps, NamedSharding(mesh, x_spec)),
        out_shardings=(NamedSharding(mesh, P()), ps),
        in_names=({k: k for k in PARAMS}, "x"),
        out_names=("loss", {k: "grad_" + k for k in PARAMS}),
    )


def cases():
    rep = {k: P() for k in PARAMS}
    return {
        "parallel_matmul_out_data_model": matmul_case(P("data", "model")),
        "parallel_matmul_out_data": matmul_case(P("data", None)),
        "mlp_dp": mlp_case("data", P("data", None), rep),
        "mlp_fsdp": mlp_case("fsdp", P("fsdp", None),
                             dict(w1=P("fsdp", None), b1=P("fsdp"), w2=P("fsdp", None), b2=P("fsdp"))),
        "mlp_tp": mlp_case("model", P(),
                           dict(w1=P(None, "model"), b1=P("model"), w2=P("model", None), b2=P())),
    }


def named_shardings(shardings, names_tree, avals):
    """{leaf name: JSON spec} in the order the names are listed (params first, in PARAMS order).
    names_tree has the pytree structure of the shardings, with a name string at each leaf."""
    leaves = jax.tree_util.tree_leaves(shardings)
    names = jax.tree_util.tree_leaves(names_tree)
    ranks = [len(a.shape) for a in jax.tree_util.tree_leaves(avals)]
    assert len(leaves) == len(names) == len(ranks), (len(leaves), names, ranks)
    got = {n: sharding_json(s, r) for n, s, r in zip(names, leaves, ranks)}
    listed = [n for n in (list(PARAMS) + ["x"] + ["loss"] + ["grad_" + k for k in PARAMS] + ["y"]) if n in got]
    return {n: got[n] for n in listed}


def run_case(name, c, hlo_dir=None):
    mesh = c["mesh"]
    out_avals = jax.eval_shape(c["fn"], *c["args"])
    compiled = jax.jit(c["fn"], in_shardings=c["in_shardings"],
                       out_shardings=c["out_shardings"]).lower(*c["args"]).compile()
    hlo = compiled.as_text()
    if hlo_dir:
        with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
            f.write(hlo)
    colls = collectives_from_hlo(hlo, mesh)
    totals, total = totals_of(colls)

    auto = jax.jit(c["fn"], in_shardings=c["in_shardings"]).lower(*c["args"]).compile()
    auto_colls = collectives_from_hlo(auto.as_text(), mesh)
    auto_totals, auto_total = totals_of(auto_colls)

    return dict(
        mesh={a: int(s) for a, s in mesh.shape.items()},
        in_shardings=named_shardings(c["in_shardings"], c["in_names"], c["args"]),
        out_shardings=named_shardings(c["out_shardings"], c["out_names"], out_avals),
        collectives=colls,
        totals=totals,
        total_bytes_per_device=total,
        unspecified_out=dict(
            out_shardings=named_shardings(auto.output_shardings, c["out_names"], out_avals),
            totals=auto_totals,
            total_bytes_per_device=auto_total,
        ),
    )


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def dumps(obj, indent=0):
    """JSON with one item per line, except that a value whose one-line form is short (a shape,
    a spec, a mesh, the replica groups) stays on one line."""
    flat = json.dumps(obj)
    if not isinstance(obj, (dict, list)) or len(flat) + indent <= 100:
        return flat
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [inner + dumps(v, indent + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def fmt_bytes(b):
    return f"{b:,.0f}" if float(b).is_integer() else f"{b:,.2f}"


def print_case(name, r):
    mesh = ", ".join(f"{a}={s}" for a, s in r["mesh"].items())
    print(f"\n== {name}  mesh ({mesh})")
    print(f"   in : {r['in_shardings']}")
    print(f"   out: {r['out_shardings']}")
    print(f"   out picked by XLA when unspecified: {r['unspecified_out']['out_shardings']}"
          f"  (then {fmt_bytes(r['unspecified_out']['total_bytes_per_device'])} B/device)")
    hdr = f"   {'kind':<19} {'result shape':<34} {'n':>2} {'axes':<14} {'bytes/device':>15}"
    print(hdr)
    print("   " + "-" * (len(hdr) - 3))
    for c in r["collectives"]:
        shape = c["shape"] if len(c["shape"]) <= 34 else f"({c['tuple_size']} arrays) " + c["result_shapes"][0] + ",..."
        axes = ",".join(c.get("mesh_axes") or []) or ("pairs" if "source_target_pairs" in c else "?")
        print(f"   {c['kind']:<19} {shape:<34} {c.get('group_size', '-'):>2} {axes:<14} {fmt_bytes(c['bytes_per_device']):>15}")
    for k, t in r["totals"].items():
        print(f"   total {k:<13} x{t['count']:<3} {'':<46} {fmt_bytes(t['bytes_per_device']):>15}")
    print(f"   TOTAL {'':<63} {fmt_bytes(r['total_bytes_per_device']):>15}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=GOLDEN, help="JSON to write (default: the golden file next to this script)")
    ap.add_argument("--check", action="store_true", help="compare with the golden JSON instead of writing it")
    ap.add_argument("--hlo-dir", help="also write each case's optimized HLO text here")
    ap.add_argument("--quiet", action="store_true", help="no tables")
    args = ap.parse_args()
    _self_test()
    if len(jax.devices()) != NUM_DEVICES:
        sys.exit(f"expected {NUM_DEVICES} CPU devices, got {jax.devices()} (XLA_FLAGS={os.environ['XLA_FLAGS']})")
    if args.hlo_dir:
        os.makedirs(args.hlo_dir, exist_ok=True)

    results = {name: run_case(name, c, args.hlo_dir) for name, c in cases().items()}
    if not args.quiet:
        for name, r in results.items():
            print_case(name, r)
    doc = dict(
        generated=datetime.date.today().isoformat(),
        jax_version=jax.__version__,
        jaxlib_version=jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
        backend="cpu",
        num_devices=NUM_DEVICES,
        dtype="float32",
        byte_model={
            "all-gather": "(n-1)/n * result bytes",
            "reduce-scatter": "(n-1)/n * operand bytes",
            "all-reduce": "2(n-1)/n * operand bytes",
            "all-to-all": "(n-1)/n * operand bytes",
            "collective-permute": "operand bytes",
        },
        cases=results,
    )
    text = dumps(doc) + "\n"
    if args.check:
        with open(GOLDEN) as f:
            golden = json.load(f)
        new = json.loads(text)
        for d in (golden, new):
            d.pop("generated", None)
        if golden != new:
            diff = [k for k in sorted(set(golden["cases"]) | set(new["cases"]))
                    if golden["cases"].get(k) != new["cases"].get(k)]
            other = [k for k in golden if k != "cases" and golden.get(k) != new.get(k)]
            sys.exit(f"differs from {GOLDEN}: cases {diff}, fields {other}")
        print(f"\nmatches {GOLDEN}")
        return
    with open(args.out, "w") as f:
        f.write(text)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
