"""Run-config dicts for tests: a default config with some keys of its blocks overridden."""

from __future__ import annotations

from typing import Any


def merged(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` with ``overrides`` laid over it block by block: a mapping on both sides is merged the same
    way, any other value is replaced (``{"optimizer": {"learning_rate": 1e-2}}`` keeps the default batch)."""
    result = dict(defaults)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result
