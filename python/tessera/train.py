"""The Trainer `tessera train` runs, from Python.

    trainer = tessera.train.Trainer("configs/fortunes.toml", {"train": {"steps": 100}})
    summary = trainer.fit(callback=lambda step: print(step))
    params = trainer.params

It prepares data, builds the model and optimizer, resumes from the newest valid
checkpoint in run.dir, compiles the step, trains with checkpoints, evaluation,
metrics.jsonl, TensorBoard and goodput events. Ctrl-C finishes the current step, saves a
checkpoint and raises KeyboardInterrupt (a later fit() resumes from it).
"""

from . import _tessera as C
from ._config import config_keys, make_config

__all__ = ["Trainer", "config_keys"]


class Trainer:
    """config: a TOML path, a dict {"section": {"key": value}}, or None (defaults);
    overrides: a dict of the same form or a list of "section.key=value" strings."""

    def __init__(self, config=None, overrides=None):
        self._config = make_config(config, overrides)
        self._trainer = C._Trainer(self._config)
        self.summary = None

    def fit(self, callback=None, progress=False, stop_at_step=0):
        """Trains to train.steps (or stop_at_step, or the time limit); callback(step) runs after
        every optimizer step. Returns the summary (steps, losses, tokens/s, MFU, goodput)."""
        self.summary = self._trainer.fit(callback, bool(progress), int(stop_at_step))
        if self.summary["stop_reason"] == "signal SIGINT":
            raise KeyboardInterrupt(f"training stopped at step {self.summary['end_step']} (checkpoint saved)")
        return self.summary

    @property
    def params(self):
        """The parameters after fit() (a pytree), or None before."""
        return self._trainer.params()

    @property
    def opt_state(self):
        return self._trainer.opt_state()

    @property
    def config_json(self):
        return self._config.to_json()
