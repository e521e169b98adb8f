"""Domain objects of the reward service: what the core scores, independent of protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class Sample:
    """One prompt/completion pair. ``metadata`` holds the dataset columns (JSON values)."""

    id: str
    completion: str
    prompt: tuple[Message, ...] = ()
    completion_ids: tuple[int, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    group: str = ""


@dataclass(frozen=True)
class RewardRequest:
    """One reward to compute: ``name`` is a built-in or ``prm:<model>`` / ``orm:<model>``."""

    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class ComponentResult:
    """One reward's outcome for one sample; ``value`` is None when ``error`` says why."""

    value: float | None = None
    step_scores: list[float] = field(default_factory=list)
    error: str = ""


@dataclass
class SampleResult:
    id: str
    reward: float | None
    components: list[tuple[str, ComponentResult]]


@dataclass(frozen=True)
class ParamInfo:
    name: str
    type: str  # JSON type: number, integer, boolean, string, array
    default: Any
    description: str
    choices: tuple[Any, ...] = ()  # allowed values when not empty
    minimum: float | None = None  # inclusive bounds of number/integer params
    maximum: float | None = None


@dataclass(frozen=True)
class RewardDescription:
    """What ListRewards reports about one reward."""

    name: str
    description: str
    params: tuple[ParamInfo, ...] = ()
    required_metadata: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    group_aware: bool = False
    available: bool = True
    status: str = ""
