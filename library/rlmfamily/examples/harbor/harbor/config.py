"""Configuration: built-in defaults, overlaid by the deploy files.

LAYERS lists the sources in the order they are applied. A key set by a later
layer replaces the value from an earlier one, so the environment's own file
has the last word.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"

DEFAULTS = {
    "spool": {"path": "/var/spool/harbor", "poll_s": 5},
    "upload": {"max_attempts": 3, "backoff_s": 2.0, "timeout_s": 60},
    "storage": {"bucket": "exports-dev", "region": "eu-west-1"},
}

LAYERS = ["built-in DEFAULTS", "deploy/base.toml", "deploy/<env>.toml"]


def _merge(into: dict, layer: dict) -> dict:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def load(env: str) -> dict:
    config = _merge({}, DEFAULTS)
    for name in ("base", env):
        path = DEPLOY / f"{name}.toml"
        if path.exists():
            _merge(config, tomllib.loads(path.read_text()))
    return config
