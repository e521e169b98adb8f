"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiny_models.make import make_all

# Nothing in the tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# TINY_MODELS_DIR points the suite at models built elsewhere (test_judge_on_any_cpu.py does).
MODELS_DIR = Path(os.environ.get("TINY_MODELS_DIR") or Path(__file__).parent / "assets" / "models")


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """Kind → directory of each tiny model (created on first use, see tiny_models/make.py)."""
    return make_all(MODELS_DIR)
