"""Optimizers, schedules and clipping: the trainer's own (name = adamw: fused, decoupled
weight decay masked by parameter kind; sgd with momentum; lion; adafactor: factored second
moments; muon: Newton-Schulz-orthogonalized momentum for hidden matrices, AdamW for the
rest), global-norm clipping, warm-up + cosine / linear / warmup-stable-decay schedules.

    opt = tessera.optim.Optimizer(model, name="adamw", weight_decay=0.1, clip_norm=1.0)
    state = opt.init(params)
    params, state, grad_norm = opt.apply(params, grads, state, lr=3e-4)
    lr = tessera.optim.learning_rate(step, peak_lr=3e-4, warmup_steps=100, total_steps=5000)
"""

from . import _tessera as C
from ._config import make_config
from ._convert import asarray
from ._tessera import clip_by_global_norm, global_norm

__all__ = ["Optimizer", "learning_rate", "adamw_update", "clip_by_global_norm", "global_norm"]


class Optimizer:
    """The optimizer of a model (its parameter kinds select the weight-decay mask);
    keyword arguments are optimizer.* config keys (name, beta1, beta2, eps,
    weight_decay, momentum, nesterov, clip_norm, loss_scale...)."""

    def __init__(self, model, **optimizer_keys):
        # The model's compute dtype resolves loss_scale = "auto" (dynamic for float16).
        section = {"optimizer": optimizer_keys} if optimizer_keys else {}
        section["model"] = {"compute_dtype": model._compute_dtype}
        self._config = make_config(section)
        self._optimizer = C._Optimizer(self._config, model._model)

    def init(self, params):
        """The optimizer state (moments like params, step count, loss scale) as a pytree."""
        return self._optimizer.init(params)

    def apply(self, params, grads, state, lr):
        """(new params, new state, gradient global norm before clipping) after one step."""
        return self._optimizer.apply(params, grads, state, lr if hasattr(lr, "_dtype_name") else asarray(lr, "float32"))


def learning_rate(step, peak_lr=1e-3, decay="cosine", warmup_steps=0, total_steps=1000, min_lr_ratio=0.1,
                  decay_fraction=0.2):
    """The learning rate of optimizer step `step` (0-based): linear warm-up over
    warmup_steps, then cosine / linear decay to min_lr_ratio * peak_lr at total_steps
    (or constant; "wsd": at the peak until the last decay_fraction of the steps after
    warm-up, then linear down), exactly as `tessera train` schedules it."""
    config = make_config({
        "optimizer": {"lr": float(peak_lr)},
        "schedule": {"decay": decay, "warmup_steps": int(warmup_steps), "min_lr_ratio": float(min_lr_ratio),
                     "decay_fraction": float(decay_fraction)},
        "train": {"steps": int(total_steps)},
    })
    return C._learning_rate(config, int(step))


def adamw_update(param, grad, m, v, lr, step, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One fused AdamW step of one array: (param', m', v'); lr a float scalar, step the
    1-based step count (arrays, so a jitted step compiles once for every step)."""
    return tuple(C._adamw_update(param, grad, m, v, lr, step, beta1, beta2, eps, weight_decay))
