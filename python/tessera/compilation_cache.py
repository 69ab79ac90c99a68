"""The persistent compilation cache (jax.config's compilation cache): compiled programs
stored in a directory and loaded by later processes, keyed by the traced program, the
compile options and this build. Off unless set_dir() or TESSERA_COMPILATION_CACHE_DIR
names a directory; `tessera cache ls/clear` manages it."""

import os

from ._tessera._compilation_cache import set_dir as _set_dir
from ._tessera._compilation_cache import stats

__all__ = ["set_dir", "stats"]


def set_dir(path, max_mb=2048):
    """Caches compiled programs in `path` (None or "" turns the cache off)."""
    _set_dir("" if path is None else os.fspath(path), int(max_mb))
