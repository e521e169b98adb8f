"""Configuration of the remote judges (the ``judges:`` block of the reward service's YAML).

Only the server operator names the endpoints: a Score request selects a judge by name (``judge:<name>``)
and may set its ``mode``, never a URL, a model or a header, so a caller cannot make the service send
traffic anywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

from grpo_runtime.config import ConfigError
from grpo_runtime.errors import InvalidArgument
from reward_service.judges.template import (
    DEFAULT_GROUP_SCORES_TEMPLATE,
    DEFAULT_POINTWISE_TEMPLATE,
    JudgeTemplate,
)


class RemoteJudgeSettings(BaseModel, extra="forbid"):
    """One OpenAI-compatible chat-completions endpoint used as a judge.

    Each sample (pointwise) or group (``mode: group``) is one ``POST {base_url}/chat/completions`` with the
    filled template as the user turn, ``temperature`` 0 and at most ``max_tokens``; at most
    ``max_concurrency`` are in flight per judge. 429 and 5xx answers and connection errors are retried
    ``retries`` times, after ``backoff_s x 2^attempt`` seconds (at most ``max_backoff_s``; a ``Retry-After``
    in seconds is honoured within that cap). A sample not scored within ``timeout_s`` of being sent, retries
    included, is a component error naming the limit.
    """

    base_url: str = Field(description="Endpoint root, e.g. http://127.0.0.1:8000/v1 (http or https).")
    model: str = Field(min_length=1, description="The `model` of each request.")
    api_key_env: str | None = Field(None, description="Environment variable holding the bearer token.")
    api_key_file: Path | None = Field(
        None, description="File holding the bearer token (e.g. a mounted secret)."
    )
    template: str = Field(DEFAULT_POINTWISE_TEMPLATE, description="Pointwise template ({completion}).")
    group_template: str = Field(
        DEFAULT_GROUP_SCORES_TEMPLATE, description="mode=group: one request per group ({completions})."
    )
    verdict: Literal["yes_no", "score"] = Field(
        "yes_no",
        description="yes_no: the answer's first word is positive (1.0) or negative (0.0); score: its first "
        "number, 0..max_score, divided by max_score. Group answers are always '[k]: score' lines.",
    )
    positive: str = "Yes"
    negative: str = "No"
    max_score: float = Field(10.0, gt=0)
    max_tokens: int = Field(16, ge=1, description="Completion tokens per pointwise answer.")
    group_max_tokens: int = Field(256, ge=1, description="Completion tokens per group answer.")
    max_concurrency: int = Field(8, ge=1)
    retries: int = Field(3, ge=0)
    backoff_s: float = Field(0.5, ge=0)
    max_backoff_s: float = Field(8.0, ge=0)
    timeout_s: float = Field(30.0, gt=0)
    max_completion_chars: int = Field(
        16000, ge=64, description="Longer completions are cut in the middle, with a marker saying so."
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _templates(self) -> RemoteJudgeSettings:
        # InvalidArgument is an API error; in a config file it is a plain validation error.
        templates = (
            (self.template, "pointwise", "template"),
            (self.group_template, "group_scores", "group_template"),
        )
        for text, kind, name in templates:
            try:
                JudgeTemplate.parse(text, kind=kind, field=name)
            except InvalidArgument as exc:
                raise ValueError(f"{name}: {exc.message}") from exc
        if self.api_key_env and self.api_key_file:
            raise ValueError("set api_key_env or api_key_file, not both")
        return self

    def api_key(self, name: str) -> str | None:
        """The bearer token (never logged), read when the service starts; ConfigError naming the setting."""
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ConfigError(f"judges.{name}.api_key_env: {self.api_key_env} is not set")
            return key
        if self.api_key_file:
            try:
                return self.api_key_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"judges.{name}.api_key_file: cannot read it ({exc.strerror})") from exc
        return None
