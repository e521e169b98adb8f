"""Fixtures of the trainer unit tests: the tiny policy and its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def policy_dir(tiny_models) -> Path:
    return tiny_models["policy"]


@pytest.fixture(scope="module")
def tokenizer(policy_dir):
    return AutoTokenizer.from_pretrained(policy_dir)
