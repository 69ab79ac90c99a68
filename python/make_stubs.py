"""Writes the type stubs of the `_tessera` extension (python/CMakeLists.txt runs this at
build time): nanobind's stubgen over the extension imported on its own (so the methods
tessera/_array_methods.py installs come from stubgen_patterns.txt, typed, not as
lambdas), then the few names stubgen cannot see: the exception classes (made with the
C API) and the NumPy import the patterns use.

    python make_stubs.py <package dir holding _tessera*.so> <patterns file>
"""

import glob
import os
import shutil
import sys
import tempfile

package_dir, patterns = sys.argv[1], sys.argv[2]
# The extension alone on sys.path (the package directory also holds tessera/numpy.py,
# which would shadow NumPy).
alone = tempfile.mkdtemp()
for so in glob.glob(os.path.join(package_dir, "_tessera*.so")):
    shutil.copy(so, alone)
sys.path.insert(0, alone)
from nanobind.stubgen import main  # noqa: E402

out_dir = os.path.join(package_dir, "_tessera")
main(["-m", "_tessera", "-r", "-P", "-q", "-O", package_dir, "-p", patterns])

shutil.rmtree(alone, ignore_errors=True)

EXCEPTIONS = """

class Error(RuntimeError): ...
class ShapeError(ValueError): ...
class DTypeError(TypeError): ...
class AxisError(ValueError, IndexError): ...
class TransformError(TypeError): ...
class ShardingError(ValueError): ...
class ConfigError(ValueError): ...
"""
init = os.path.join(out_dir, "__init__.pyi")
with open(init) as f:
    text = f.read()
with open(init, "w") as f:
    f.write("import numpy\n" + text + EXCEPTIONS)
