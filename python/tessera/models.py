"""tessera's model family (GPT-2 and Llama presets, from `tiny` to `gpt2-350m` /
`llama-1b`): the same Model `tessera train` builds, usable in any Python loop.

    model = tessera.models.Model("gpt2-small")          # or Model("tiny", d_model=128)
    params = model.init(seed=0)                          # a dict pytree of arrays
    loss = model.loss(params, tokens, targets)           # a lazy float32 scalar
    grads = tessera.jit(tessera.grad(model.loss))(params, tokens, targets)
"""

from . import _tessera as C
from ._config import make_config

__all__ = ["Model", "document_positions", "preset_names"]


def preset_names():
    return list(C._preset_names())


def document_positions(segment_ids):
    """Positions inside each document of packed rows: int32 [B, T], 0 where a row starts or
    the segment id changes, counting up from there (what tessera's data pipeline writes).
    segment_ids must be concrete (not traced): under jit, pass positions to Model.loss."""
    import numpy as np

    from ._convert import array

    try:
        ids = np.asarray(segment_ids)
    except Exception as e:  # a tracer has no values
        raise TypeError("document_positions: segment_ids have no values here (inside jit?); "
                        "pass positions= to Model.loss / Model.logits") from e
    if ids.ndim != 2:
        raise ValueError(f"document_positions: segment_ids must be [B, T], got shape {ids.shape}")
    index = np.arange(ids.shape[1])
    starts = np.ones(ids.shape, dtype=bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    return array((index - first).astype(np.int32))


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

    def loss(self, params, tokens, targets, dropout_key=None, segment_ids=None, positions=None):
        """Mean next-token cross-entropy of the logits of tokens [B, T] against targets [B, T]
        (targets of -100 do not count). segment_ids / positions: see logits."""
        if segment_ids is not None and positions is None:
            positions = document_positions(segment_ids)
        return self._model.loss(params, tokens, targets, dropout_key, segment_ids, positions)

    def logits(self, params, tokens, dropout_key=None, segment_ids=None, positions=None):
        """Logits [B, T, vocab] of int32 tokens [B, T]. With segment_ids (int32 [B, T]) a row
        holds several packed documents: a token attends only to earlier tokens of its own
        segment and is embedded at its position inside it (positions, int32 [B, T]; by
        default document_positions(segment_ids)), so each document gets the logits it would
        get alone."""
        if segment_ids is not None and positions is None:
            positions = document_positions(segment_ids)
        return self._model.logits(params, tokens, dropout_key, segment_ids, positions)

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
