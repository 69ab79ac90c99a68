#!/usr/bin/env python3
"""JAX oracle for tessera's Python API: writes tests/oracles/goldens/jax_python.json.

The functions are not written here: python/tests/oracle_functions.py defines each case
once, against an adapter namespace, and python/tests/test_oracle_jax.py runs the same code
with tessera and compares with this golden. This script runs every case with JAX (CPU,
float32 default: x64 off, as in a plain `import jax`) in the kinds the case has: "out",
"grad" (gradient of sum(out * w) w.r.t. the floating inputs), "vmap" (over a leading batch
axis) and "vmap_grad"; and stores, per result, its shape, dtype and values.

Values: floating results as float32 numbers written in their shortest round-trip form
(bfloat16/float16 values are exactly float32 ones), NaN and +-inf as the strings "nan",
"inf", "-inf"; integers as integers; bools as 0/1.

Run through tests/oracles/run_oracle.sh jax_python (pinned venv, live diff against the
committed golden); do not edit the golden by hand.

Usage: jax_python.py OUT.json
"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", False)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import oracle_functions as of  # noqa: E402

GENERATOR = "tests/oracles/jax_python.py"


def number(v, kind):
    if kind == "f":
        v = np.float32(v)
        if np.isnan(v):
            return '"nan"'
        if np.isinf(v):
            return '"inf"' if v > 0 else '"-inf"'
        return str(v)  # NumPy's shortest repr that round-trips the float32
    return str(int(v))


def tensor(a):
    a = np.asarray(a)
    kind = "f" if a.dtype.name in of.FLOATS else "i"
    data = "[" + ", ".join(number(v, kind) for v in a.astype(np.float32 if kind == "f" else np.int64).ravel()) + "]"
    return f'{{"shape": {json.dumps(list(a.shape))}, "dtype": "{a.dtype.name}", "data": {data}}}'


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    lib = of.jax_lib()
    cases = of.cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), "duplicate case names"
    out = []
    for case in cases:
        results = []
        for kind in case.kinds():
            arrays = of.run_case(lib, case, kind)
            results.append(f'        "{kind}": [\n' + ",\n".join("          " + tensor(a) for a in arrays) + "\n        ]")
        out.append(
            "    {\n"
            f'      "name": {json.dumps(case.name)},\n'
            f'      "description": {json.dumps(case.desc)},\n'
            f'      "inputs_sha256": "{of.input_digest(case)}",\n'
            '      "results": {\n' + ",\n".join(results) + "\n      }\n    }"
        )
    versions = {"jax": jax.__version__, "jaxlib": jax.lib.__version__, "numpy": np.__version__,
                "python": sys.version.split()[0]}
    text = (
        "{\n"
        f'  "generator": "{GENERATOR}",\n'
        f'  "functions": "python/tests/oracle_functions.py",\n'
        f'  "versions": {json.dumps(versions)},\n'
        f'  "loss": "grad = d/d(floating inputs) of sum(out.astype(float32) * w), w = loss_weights(out.shape)",\n'
        f'  "batch": {of.BATCH},\n'
        '  "cases": [\n' + ",\n".join(out) + "\n  ]\n}\n"
    )
    json.loads(text)  # well-formed
    with open(sys.argv[1], "w") as f:
        f.write(text)
    print(f"jax_python: {len(cases)} cases, {sum(len(c.kinds()) for c in cases)} results -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
