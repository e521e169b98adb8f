"""Builds a reward model's engine: loads it (``loading.load_model``), picks the engine class of its kind and
turns on the fast paths that are exact for it. This module imports torch and transformers; the registry
imports it at the first load, so a service that scores only rule rewards never does.
"""

from __future__ import annotations

import logging

from reward_service.core.types import Message, Sample
from reward_service.models.engine import RewardModelEngine
from reward_service.models.judge import JudgeModel
from reward_service.models.loading import LoadedModel, load_model
from reward_service.models.orm import OutcomeRewardModel
from reward_service.models.prm import ProcessRewardModel
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind

__all__ = ["ENGINES", "FAST_PATH_PROBE", "FAST_PATH_TOLERANCE", "build_engine", "load_model"]

log = logging.getLogger(__name__)

# Scored at load, plainly and through each fast path (engine.check_fast_paths): three completions
# of one prompt, so they share a prefix, each with two steps for the PRM formats.
_PROBE_PROMPT = (
    Message("system", "You are a careful tutor."),
    Message("user", "What is 12 + 7 - 4? Explain."),
)
FAST_PATH_PROBE = [
    Sample(id=str(i), prompt=_PROBE_PROMPT, completion=completion)
    for i, completion in enumerate(
        (
            "12 + 7 = 19.\n\n19 - 4 = 15, so the answer is 15.",
            "First add: 12 + 7 = 19.\n\nThen subtract 4 to get \\boxed{15}.",
            "12 - 4 = 8.\n\n8 + 7 = 16.",
        )
    )
]
# Largest difference a fast path may make to an output (x max(1, |output|)), by model dtype.
FAST_PATH_TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}

ENGINES: dict[ModelKind, type[RewardModelEngine]] = {
    ModelKind.PRM: ProcessRewardModel,
    ModelKind.ORM: OutcomeRewardModel,
    ModelKind.JUDGE: JudgeModel,
}


def build_engine(loaded: LoadedModel, settings: ModelSettings) -> RewardModelEngine:
    """The engine of ``loaded`` with the fast paths that are exact for it turned on (blocking)."""
    engine = ENGINES[loaded.spec.kind](
        loaded, max_batch_tokens=settings.max_batch_tokens, overhead_tokens=settings.forward_overhead_tokens
    )
    enabled = engine.check_fast_paths(FAST_PATH_PROBE, FAST_PATH_TOLERANCE[loaded.dtype])
    engine.share_prefixes = engine.share_prefixes and settings.share_prefixes
    log.info("%s: fast paths %s", loaded.spec.reward_name, enabled)
    return engine
