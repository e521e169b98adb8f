"""The built-in rewards by name, in ListRewards order."""

from __future__ import annotations

from reward_service.mathverify.pool import MathVerifyPool
from reward_service.rewards.accuracy import Accuracy, CosineReward, LengthReward, SoftOverlong
from reward_service.rewards.base import Reward, ThreadRunner
from reward_service.rewards.code import CodeReward
from reward_service.rewards.json_schema import JsonSchemaReward
from reward_service.rewards.text import text_rewards
from reward_service.sandbox.runner import SandboxRunner


def builtin_rewards(
    pool: MathVerifyPool,
    sandbox: SandboxRunner | None,
    sandbox_available: bool,
    sandbox_status: str,
    runner: ThreadRunner | None = None,
) -> dict[str, Reward]:
    """Name → reward for every built-in, in DESIGN.md's order; ``code`` is described as unavailable when
    the sandbox is refused. ``runner`` runs the text rewards (default limits when None)."""
    runner = runner or ThreadRunner()
    text = {r.description.name: r for r in text_rewards(runner)}
    rewards: list[Reward] = [
        Accuracy(pool, runner),
        text["format"],
        text["tag_count"],
        text["reasoning_steps"],
        LengthReward(pool),
        CosineReward(pool),
        text["repetition_penalty"],
        SoftOverlong(),
        CodeReward(sandbox, sandbox_available, sandbox_status),
        JsonSchemaReward(pool),
    ]
    return {r.description.name: r for r in rewards}
