"""The reward service runs without torch (the slim image): built-in rewards only, no admin service."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import asyncio, sys
sys.modules["torch"] = None  # as if torch were not installed
from reward_service.server import ModelRegistry, start_reward_service
from reward_service.settings import RewardSettings

async def main():
    service = await start_reward_service(RewardSettings.model_validate({"checkers": {"workers": 1}}))
    try:
        names = [b.name for b in service.bindings()]
        described = [r.name for r in service.scorer.describe()]
    finally:
        await service.close()
    print(ModelRegistry, names, "accuracy" in described)

asyncio.run(main())
"""


def test_reward_service_starts_without_torch():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    services = "['grpo.reward.v1.RewardService', 'grpo.env.v1.EnvironmentService']"
    assert done.stdout.strip() == f"None {services} True"
