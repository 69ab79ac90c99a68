"""Checkpoints of pytrees.

save / load: one safetensors file (tensor names are the leaves' dotted paths, written
beside the target and renamed over it). CheckpointManager: the run directory's
checkpoints as `tessera train` keeps them (atomic commit, checksums verified before
use, retention), so a Python loop gets the same guarantees.
"""

import os

from . import _tessera as C

__all__ = ["save", "load", "CheckpointManager", "verify"]


def save(path, tree):
    """Writes a pytree of arrays (dicts with str keys, lists) to a safetensors file."""
    C._save_safetensors(os.fspath(path), tree)


def load(path):
    """{dotted path: array} from a safetensors file (validated)."""
    return dict(C._load_safetensors(os.fspath(path)))


def verify(checkpoint_dir):
    """(ok, problem): whether a checkpoint directory's files match their checksums."""
    return C._verify_checkpoint(os.fspath(checkpoint_dir))


class CheckpointManager:
    def __init__(self, run_dir, keep_last=3, keep_every=0):
        self._manager = C._CheckpointManager(os.fspath(run_dir), keep_last, keep_every)

    def save(self, step, params, opt_state=None):
        """Saves atomically (then applies retention); returns the checkpoint's path."""
        return self._manager.save(step, params, {} if opt_state is None else opt_state)

    def steps(self):
        return list(self._manager.steps())

    def restore_latest(self, params_like, opt_like=None):
        """(step, params, opt_state) of the newest checkpoint that verifies and matches the
        structure of params_like / opt_like, or None; damaged ones are skipped with a warning."""
        import warnings

        step, params, opt, skipped = self._manager.restore_latest(params_like, {} if opt_like is None else opt_like)
        for w in skipped:
            warnings.warn(w)
        return None if step is None else (step, params, opt)
