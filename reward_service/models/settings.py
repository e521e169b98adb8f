"""Configuration of the reward-model part of the reward service (the ``models:`` block of its YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from reward_service.models.spec import ModelKind, ModelSpec, PrmFormat


class PreloadModel(BaseModel, extra="forbid"):
    """A model loaded when the service starts; fields as in ``LoadModelRequest``."""

    name: str
    path: str
    kind: Literal["prm", "orm", "judge"]
    prm_format: Literal["auto", "token_classification", "step_tag"] = "auto"
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    step_token: str | None = None
    positive_token: str | None = None
    negative_token: str | None = None
    judge_template: str | None = None
    judge_group_template: str | None = None

    def to_spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name,
            path=self.path,
            kind=ModelKind(self.kind),
            prm_format=PrmFormat(self.prm_format),
            device=self.device,
            dtype=self.dtype,
            trust_remote_code=self.trust_remote_code,
            step_token=self.step_token,
            positive_token=self.positive_token,
            negative_token=self.negative_token,
            judge_template=self.judge_template,
            judge_group_template=self.judge_group_template,
        )


class ModelSettings(BaseModel, extra="forbid"):
    """Defaults and limits for every loaded reward model.

    The dynamic batcher of each model collects the sequences of concurrent requests and runs one
    padded forward when the padded batch reaches ``max_batch_tokens`` (batch size x longest sequence)
    or the oldest waiting sequence has waited ``max_wait_ms``. With ``dynamic_batching`` off, each
    request's sequences are one forward of their own (the baseline of bench/prm_bench.py).

    A flush is cut into forwards of sequences of similar length so that the padded tokens plus
    ``forward_overhead_tokens`` per forward (what one more forward costs, counted in tokens) is
    least. With ``share_prefixes``, the sequences of a request that start with the same tokens
    (the prompt) share one computation of them, at least ``min_shared_prefix_tokens`` long, on
    models where that reproduces the plain forward (checked at load).
    """

    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    allow_trust_remote_code: bool = False
    # Padded tokens per forward (B x T_max, T = tokens computed: a shared prefix comes from its KV
    # cache). Moderate batches stay in CPU caches; raise it on a GPU.
    max_batch_tokens: int = Field(default=4096, ge=1)
    max_wait_ms: float = Field(default=5.0, ge=0.0)
    dynamic_batching: bool = True
    forward_overhead_tokens: int = Field(default=64, ge=0)
    share_prefixes: bool = True
    min_shared_prefix_tokens: int = Field(default=16, ge=1)
    # Longest sequence scored, in tokens, on top of the model's own max_position_embeddings.
    max_sequence_tokens: int | None = Field(default=None, ge=1)
    preload: list[PreloadModel] = Field(default_factory=list)
