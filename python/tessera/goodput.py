"""Goodput from any Python training loop (tessera's, PyTorch's, JAX's): the Recorder
writes RUN_DIR/goodput/events.jsonl, the log `tessera goodput RUN_DIR` and report()
turn into where the time went (productive steps, data waits, compilation, checkpoints,
restarts, failures).

    rec = tessera.goodput.Recorder("runs/mine")
    rec.job_start("my-job"); rec.attempt_start()
    with rec.phase("compile"): step = build()
    for i in range(steps):
        with rec.phase("data_wait"): batch = next(loader)
        with rec.step(i, tokens=4096, model_flops=flops): step(batch)
    rec.job_end(ok=True)
    print(tessera.goodput.report("runs/mine"))
"""

import contextlib
import json

from ._tessera._goodput import Recorder as _Recorder
from ._tessera._goodput import report_json, report_table

__all__ = ["Recorder", "report", "report_dict"]


class Recorder(_Recorder):
    """The event log of one job (see the module docstring). Thread-safe; each event is one
    line, phase boundaries are fsynced."""

    @contextlib.contextmanager
    def step(self, step, tokens=0, model_flops=0.0):
        """A productive step (its end is recorded only when the body succeeds)."""
        self.step_start(step)
        yield
        self.step_end(step, tokens, model_flops)

    @contextlib.contextmanager
    def phase(self, name, step=0, cache_hit=False):
        """A badput phase: backend_init, compile, checkpoint_restore, checkpoint_save,
        data_wait, eval, or any other name (a custom badput type). The end is recorded
        also when the body raises."""
        start, end = _PHASES.get(name, (None, None))
        if start is None:
            self.custom_badput_start(name)
        else:
            start(self, step)
        try:
            yield
        finally:
            if end is None:
                self.custom_badput_end(name)
            else:
                end(self, step, cache_hit)

    @contextlib.contextmanager
    def job(self, name=""):
        """job_start + attempt_start, then job_end(ok) (ok False and a failure event on an
        exception, which propagates)."""
        self.job_start(name)
        self.attempt_start()
        try:
            yield self
        except BaseException as e:
            self.failure(0, 1, f"{type(e).__name__}: {e}")
            self.job_end(False)
            raise
        self.job_end(True)


_PHASES = {
    "backend_init": (lambda r, s: r.backend_init_start(), lambda r, s, h: r.backend_init_end()),
    "compile": (lambda r, s: r.compile_start(), lambda r, s, h: r.compile_end(h)),
    "checkpoint_restore": (lambda r, s: r.checkpoint_restore_start(s), lambda r, s, h: r.checkpoint_restore_end(s)),
    "checkpoint_save": (lambda r, s: r.checkpoint_save_start(s), lambda r, s, h: r.checkpoint_save_end(s)),
    "data_wait": (lambda r, s: r.data_wait_start(), lambda r, s, h: r.data_wait_end()),
    "eval": (lambda r, s: r.eval_start(), lambda r, s, h: r.eval_end()),
}


def report(run_dir):
    """The goodput table of a run directory (what `tessera goodput RUN_DIR` prints)."""
    return report_table(str(run_dir))


def report_dict(run_dir):
    """The same report as a dict (the JSON `tessera goodput --json` writes)."""
    return json.loads(report_json(str(run_dir)))
