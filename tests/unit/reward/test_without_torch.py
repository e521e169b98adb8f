"""The reward service runs without torch (the slim image): built-in rewards only, no admin service. With torch
installed, torch and transformers load with the first reward model, not at the service's start."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import asyncio, sys
sys.modules["torch"] = None  # as if torch were not installed
from reward_service.server import models_installed, start_reward_service
from reward_service.settings import RewardSettings

async def main():
    service = await start_reward_service(RewardSettings.model_validate({"checkers": {"workers": 1}}))
    try:
        names = [b.name for b in service.bindings()]
        described = [r.name for r in service.scorer.describe()]
    finally:
        await service.close()
    print(models_installed(), names, "accuracy" in described)

asyncio.run(main())
"""


def test_reward_service_starts_without_torch():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    services = "['grpo.reward.v1.RewardService', 'grpo.env.v1.EnvironmentService']"
    assert done.stdout.strip() == f"False {services} True"


LAZY_PROGRAM = """
import asyncio, sys
from reward_service.models.spec import ModelKind, ModelSpec
from reward_service.server import start_reward_service
from reward_service.settings import RewardSettings

async def main(model_path):
    service = await start_reward_service(RewardSettings.model_validate({"checkers": {"workers": 1}}))
    try:
        at_start = [name for name in ("torch", "transformers") if name in sys.modules]
        await service.registry.load(ModelSpec(name="m", path=model_path, kind=ModelKind.ORM))
        after_load = [name for name in ("torch", "transformers") if name in sys.modules]
    finally:
        await service.close()
    print(at_start, after_load)

asyncio.run(main(sys.argv[1]))
"""


def test_torch_and_transformers_load_with_the_first_model(tiny_models):
    done = subprocess.run(
        [sys.executable, "-c", LAZY_PROGRAM, str(tiny_models["orm"])],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[] ['torch', 'transformers']"
