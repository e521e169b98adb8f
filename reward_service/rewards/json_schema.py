"""``json_schema``: does the completion's JSON satisfy the sample's schema (``jsonschema`` library). The check
itself runs in the checker pool (``reward_service.checkers.json_schema``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from reward_service.checkers.pool import CheckerPool
from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import missing_metadata


class JsonSchemaReward:
    """1.0 when the completion's JSON validates against metadata ``schema`` (draft chosen by ``$schema``),
    else 0.0 with the first validation error as the reason. ``partial_credit``: the seed's fraction of
    required fields with the right primitive type instead. Each sample is checked in the checker pool
    (see ``check_completion``); one past the pool's deadline gets an error naming it."""

    description = RewardDescription(
        name="json_schema",
        description="1.0 if the completion (last ```json block or whole text) validates against metadata "
        "'schema' (jsonschema), else 0; partial_credit: fraction of required fields with the right type.",
        params=(ParamInfo("partial_credit", "boolean", False, "Seed's fraction-of-required-fields score."),),
        required_metadata=("schema",),
        min_value=0.0,
        max_value=1.0,
    )

    def __init__(self, pool: CheckerPool):
        self._pool = pool

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        return list(await asyncio.gather(*(self._one(s, params["partial_credit"]) for s in samples)))

    async def _one(self, sample: Sample, partial: bool) -> ComponentResult:
        if "schema" not in sample.metadata:
            return missing_metadata("schema")
        value, error = await self._pool.check_json_schema(
            sample.metadata["schema"], sample.completion, partial
        )
        return ComponentResult(value=value, error=error)
