"""The built-in rewards by name, in ListRewards order."""

from __future__ import annotations

from reward_service.checkers.pool import CheckerPool
from reward_service.rewards.accuracy import (
    Accuracy,
    CosineReward,
    LengthReward,
    ReasoningAccuracy,
    SoftOverlong,
)
from reward_service.rewards.base import Reward, ThreadRunner
from reward_service.rewards.code import CodeReward
from reward_service.rewards.json_schema import JsonSchemaReward
from reward_service.rewards.text import text_rewards
from reward_service.sandbox.runner import SandboxRunner

try:
    # reasoning-gym comes with the `reward` extra; the slim image scores without its tasks.
    from reward_service.rewards.reasoning_gym import reasoning_gym_rewards
except ModuleNotFoundError as missing:
    if not (missing.name or "").startswith("reasoning_gym"):
        raise
    HAS_REASONING_GYM = False
else:
    HAS_REASONING_GYM = True


def builtin_rewards(
    pool: CheckerPool,
    sandbox: SandboxRunner | None,
    sandbox_available: bool,
    sandbox_status: str,
    runner: ThreadRunner | None = None,
) -> dict[str, Reward]:
    """Name → reward for every built-in, in DESIGN.md's order (then the later ones); ``code`` is described
    as unavailable when the sandbox is refused; then ``reasoning_gym:<task>`` for every offered task (when
    reasoning-gym is installed), scored in ``pool``'s workers. ``runner`` runs the text rewards (default
    limits when None)."""
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
        ReasoningAccuracy(pool),
        text["code_format"],
    ]
    if HAS_REASONING_GYM:
        rewards += reasoning_gym_rewards(pool)
    return {r.description.name: r for r in rewards}
