"""tessera's model family (GPT-2 and Llama presets, from `tiny` to `gpt2-350m` /
`llama-1b`): the same Model `tessera train` builds, usable in any Python loop.

    model = tessera.models.Model("gpt2-small")          # or Model("tiny", d_model=128)
    params = model.init(seed=0)                          # a dict pytree of arrays
    loss = model.loss(params, tokens, targets)           # a lazy float32 scalar
    grads = tessera.jit(tessera.grad(model.loss))(params, tokens, targets)
"""

from . import _tessera as C
from ._config import make_config

__all__ = ["Model", "preset_names"]


def preset_names():
    return list(C._preset_names())


class Model:
    """A GPT-2 / Llama model: preset name plus model.* config keys as keyword arguments."""

    def __init__(self, preset=None, **model_keys):
        section = dict(model_keys)
        if preset is not None:
            section["preset"] = preset
        config = {"model": section} if section else {}
        if "context" in section:
            # The config's cross-field checks (train.seq <= model.context) must hold for a
            # model-only config too: the training sequence is set to fit.
            config["train"] = {"seq": int(section["context"])}
        self._config = make_config(config or None)
        self._model = C._Model(self._config)

    def init(self, seed=0):
        """The parameters (deterministic in seed) as a pytree of dicts and lists."""
        return self._model.init(seed)

    def loss(self, params, tokens, targets, dropout_key=None):
        """Mean next-token cross-entropy of the logits of tokens [B, T] against targets [B, T]."""
        return self._model.loss(params, tokens, targets, dropout_key)

    def logits(self, params, tokens, dropout_key=None):
        return self._model.logits(params, tokens, dropout_key)

    @property
    def parameter_count(self):
        return self._model.parameter_count

    @property
    def vocab(self):
        return self._model.vocab

    @property
    def context(self):
        return self._model.context

    @property
    def _compute_dtype(self):
        import json

        return json.loads(self._config.to_json())["model"]["compute_dtype"]

    @property
    def config_json(self):
        """The full config (model section included) as JSON text."""
        return self._config.to_json()
