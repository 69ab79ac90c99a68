"""Every public name of the package is exercised by a test: a name that no test file
mentions fails here, so a new binding cannot land untested."""

import os
import re

import tessera as ts

MODULES = {
    "tessera": ts,
    "tessera.nn": ts.nn,
    "tessera.random": ts.random,
    "tessera.optim": ts.optim,
    "tessera.models": ts.models,
    "tessera.train": ts.train,
    "tessera.goodput": ts.goodput,
    "tessera.checkpoints": ts.checkpoints,
    "tessera.sharding": ts.sharding,
    "tessera.tree_util": ts.tree_util,
    "tessera.compilation_cache": ts.compilation_cache,
}
# Names that are modules (covered through their members) or NumPy dtype objects (covered
# by the round-trip tests through ALL_DTYPES).
NOT_FUNCTIONS = {"nn", "random", "optim", "models", "train", "goodput", "checkpoints", "sharding", "tree_util",
                 "compilation_cache", "numpy", "bool_", "uint8", "int8", "uint32", "int64", "float16", "float64",
                 "__version__"}


def public_names():
    for module_name, module in MODULES.items():
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            if name in NOT_FUNCTIONS or isinstance(getattr(module, name, None), type(os)):
                continue
            yield module_name, name


def test_every_public_name_is_used_by_a_test():
    here = os.path.dirname(__file__)
    text = ""
    for f in sorted(os.listdir(here)):
        if f.endswith(".py") and f != os.path.basename(__file__):
            text += open(os.path.join(here, f)).read()
    missing = [f"{m}.{n}" for m, n in public_names() if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert not missing, f"public names no test uses: {missing}"
