"""Training configs from Python: a TOML file, or a dict, plus "section.key=value"
overrides; one schema with `tessera train` (unknown keys are ConfigErrors with a
suggestion)."""

import json
import os

from . import _tessera as C


def _toml_value(value):
    # TOML's syntax for the override's value: JSON's spelling of numbers, strings, bools
    # and lists is TOML's too.
    return json.dumps(value)


def _flatten(prefix, value, out):
    if isinstance(value, dict):
        # a preset first: setting it resets the section's other keys to the preset's
        if "preset" in value:
            out.append(f"{prefix}.preset={_toml_value(value['preset'])}")
        for k, v in value.items():
            if k != "preset":
                _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        if not prefix or "." not in prefix:
            raise ValueError(f"config: {prefix or 'the config'} must be a section (a dict of keys), got {value!r}")
        out.append(f"{prefix}={_toml_value(value)}")


def overrides_of(values):
    """["section.key=value", ...] from a dict {"section": {"key": value}} (or a list as is)."""
    if values is None:
        return []
    if isinstance(values, dict):
        out = []
        _flatten("", values, out)
        return out
    return [str(v) for v in values]


def make_config(config=None, overrides=None):
    """A validated config from a path (str / os.PathLike), a dict, or None (the defaults)."""
    if config is None:
        return C._parse_config("", "<defaults>", overrides_of(overrides))
    if isinstance(config, (str, os.PathLike)):
        return C._load_config(os.fspath(config), overrides_of(overrides))
    if isinstance(config, dict):
        return C._parse_config("", "<dict>", overrides_of(config) + overrides_of(overrides))
    raise TypeError(f"config: expected a path, a dict or None, got {type(config).__name__}")


def config_keys():
    """Every config key with its type and default, one per line."""
    return C._describe_config_keys()
