"""Settings of the checker worker pool (the ``checkers:`` block of the reward service config): it runs
math-verify, JSON-schema validation and reasoning-gym's scoring."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


class CheckerSettings(BaseModel):
    """Worker processes, deadlines (seconds) and memory limit of the checker pool."""

    model_config = ConfigDict(extra="forbid")

    workers: int = Field(
        default_factory=lambda: max(1, len(os.sched_getaffinity(0))),
        ge=1,
        description="Worker processes (default: usable cores).",
    )
    parse_timeout_s: int = Field(10, ge=1, description="math-verify's own parse timeout (SIGALRM), as TRL.")
    verify_timeout_s: int = Field(5, ge=1, description="math-verify's own comparison timeout, as TRL.")
    deadline_s: float = Field(
        30.0, gt=0, description="Hard deadline of one sample; a worker past it is killed and replaced."
    )
    standby: bool = Field(
        True,
        description="Keep one extra worker started, so a killed worker is replaced at once (costs one idle "
        "process).",
    )
    timeout_value: float | None = Field(
        None,
        allow_inf_nan=False,
        description="Value of a sample past deadline_s (its error still says why); None = no value, as for "
        "any other failed check.",
    )
    memory_mb: int | None = Field(
        512,
        ge=16,
        description="Memory one worker may take past its start-up footprint (MiB, as an address-space "
        "limit); a sample that needs more is an error naming this limit. None = no limit.",
    )
    niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="Added to the workers' nice value: a saturated machine still schedules the server first.",
    )
