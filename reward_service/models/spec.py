"""Domain objects for reward models: what to load (`ModelSpec`) and what is loaded (`ModelInfo`)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime

# LoadModelRequest.name: lowercase letters, digits, '-', '_' and '.'.
MODEL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")

# Qwen2.5-Math-PRM (model card): steps joined and terminated by this token.
DEFAULT_STEP_SEPARATOR = "<extra_0>"
# Math-Shepherd (arXiv 2312.08935): each step ends in " ки"; P('+') vs P('-') at the tag.
DEFAULT_STEP_TAG = "ки"
DEFAULT_POSITIVE_TOKEN = "+"
DEFAULT_NEGATIVE_TOKEN = "-"
# A judge's verdict tokens: the first token of its answer to the template's yes/no question.
DEFAULT_JUDGE_POSITIVE_TOKEN = "Yes"
DEFAULT_JUDGE_NEGATIVE_TOKEN = "No"
# Qwen2.5-Math-PRM's system prompt (model card usage example).
QWEN_PRM_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


class ModelKind(enum.Enum):
    PRM = "prm"  # one score per reasoning step, addressed as ``prm:<name>``
    ORM = "orm"  # sequence classification, ``logits[:, 0]``, addressed as ``orm:<name>``
    JUDGE = "judge"  # causal LM asked a yes/no question by a template, addressed as ``judge:<name>``


class PrmFormat(enum.Enum):
    AUTO = "auto"  # detect from config.json ``architectures``
    TOKEN_CLASSIFICATION = "token_classification"  # Qwen2.5-Math-PRM style
    STEP_TAG = "step_tag"  # Math-Shepherd style


@dataclass(frozen=True)
class ModelSpec:
    """What LoadModel (or the config's ``preload``) asks for.

    ``device``/``dtype`` None means the server default. ``step_token`` None means the format's
    default (``<extra_0>`` for token classification, ``ки`` for step tags). Judges: the verdict tokens
    are ``positive_token``/``negative_token`` (default ``Yes``/``No``), the templates
    ``judge_template`` (pointwise) and ``judge_group_template`` (None: the defaults of
    ``reward_service.judges.template``).
    """

    name: str
    path: str
    kind: ModelKind
    prm_format: PrmFormat = PrmFormat.AUTO
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    step_token: str | None = None
    positive_token: str | None = None
    negative_token: str | None = None
    judge_template: str | None = None
    judge_group_template: str | None = None

    @property
    def reward_name(self) -> str:
        return f"{self.kind.value}:{self.name}"


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model as ListModels reports it. ``prm_format`` is resolved (never AUTO) for PRMs."""

    name: str
    path: str
    kind: ModelKind
    prm_format: PrmFormat | None
    version: int
    device: str
    dtype: str
    loaded_at: datetime
    max_positions: int

    @property
    def reward_name(self) -> str:
        return f"{self.kind.value}:{self.name}"
