"""``python -m trainer_service demo`` (``make run``) runs the user's own config through StartRun: the trainer
service it starts has roots and allow-lists that admit that config (its model, data, tools), and no more."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_runtime.errors import InvalidArgument
from trainer_service.cli import _demo_trainer_settings
from trainer_service.config.run_config import load_config, parse_config
from trainer_service.core.confinement import RunAllowList, RunRoots, confine
from trainer_service.settings import load_settings

REPO = Path(__file__).resolve().parents[3]
LOCAL = {"reward": "127.0.0.1:50051", "rollout": "127.0.0.1:50052"}


def sent_by_demo(path: Path) -> dict:
    """The config the demo sends to its trainer: the file with the local services' addresses filled in."""
    raw = yaml.safe_load(path.read_text())
    raw.setdefault("services", {}).update(LOCAL)
    return raw


def confine_as_demo(raw: dict) -> Path:
    settings = load_settings(_demo_trainer_settings(parse_config(raw)))
    return confine(parse_config(raw), RunRoots.of(settings), RunAllowList.of(settings))


@pytest.mark.parametrize("name", ["demo.yaml", "tools.yaml"])
def test_the_shipped_configs_pass_the_demo_trainer(name, monkeypatch):
    monkeypatch.chdir(REPO)  # `make run` runs from the repository root
    config = load_config(REPO / "configs" / name)
    assert confine_as_demo(sent_by_demo(REPO / "configs" / name)) == config.output_dir.resolve()


def test_the_demo_allow_lists_its_own_tools_and_nothing_else(monkeypatch):
    monkeypatch.chdir(REPO)
    raw = sent_by_demo(REPO / "configs" / "demo.yaml")
    tools = ["tests.support.tool_functions:multiply"]
    raw["training"] |= {
        "tools": {"functions": tools, "max_tool_calling_iterations": 1},
        "report_to": "tensorboard",
    }
    settings = _demo_trainer_settings(parse_config(raw))
    assert settings["allowed_tools"] == tools and settings["allowed_report_to"] == ["tensorboard"]
    assert settings["model_roots"] == [str(REPO / "models")]
    confine_as_demo(raw)
    # A hub id names no local directory: no model root is derived from it.
    assert _demo_trainer_settings(parse_config({**raw, "base": "org/name"}))["model_roots"] == []
    with pytest.raises(InvalidArgument, match=r"training\.tools\.functions\[0\]"):
        other = {
            **raw,
            "training": {**raw["training"], "tools": {"functions": ["tests.support.tool_functions:shout"]}},
        }
        settings = load_settings(_demo_trainer_settings(parse_config(raw)))
        confine(parse_config(other), RunRoots.of(settings), RunAllowList.of(settings))
