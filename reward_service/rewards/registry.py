"""The built-in rewards by name, in ListRewards order."""

from __future__ import annotations

from reward_service.mathverify.pool import MathVerifyPool
from reward_service.rewards.accuracy import Accuracy, CosineReward, LengthReward, SoftOverlong
from reward_service.rewards.base import Reward
from reward_service.rewards.code import CodeReward
from reward_service.rewards.json_schema import JsonSchemaReward
from reward_service.rewards.text import text_rewards
from reward_service.sandbox.runner import SandboxRunner
from reward_service.settings import RewardSettings


def builtin_rewards(
    pool: MathVerifyPool,
    sandbox: SandboxRunner | None,
    sandbox_available: bool,
    sandbox_status: str,
    settings: RewardSettings | None = None,
) -> dict[str, Reward]:
    """Name → reward for every built-in, in DESIGN.md's order; ``code`` is described as unavailable when
    the sandbox is refused. ``settings`` supplies the text rewards' deadlines (defaults when None)."""
    settings = settings or RewardSettings()
    text = {
        r.description.name: r
        for r in text_rewards(deadline_s=settings.text_deadline_s, budget_s=settings.text_budget_s)
    }
    rewards: list[Reward] = [
        Accuracy(pool, deadline_s=settings.text_deadline_s, budget_s=settings.text_budget_s),
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
