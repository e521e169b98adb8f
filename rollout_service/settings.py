"""Service settings (the YAML of ``--config`` minus its ``server:`` block), validated by pydantic."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from grpo_runtime.images import ImageLimits


class VllmSettings(BaseModel):
    """Options passed to ``vllm.LLM``."""

    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)  # CUDA only: share of GPU memory vLLM may take
    max_lora_rank: int = Field(64, ge=1)
    max_loras: int = Field(2, ge=1)
    cpu_kvcache_space_gib: int = Field(1, ge=1)  # CPU only: VLLM_CPU_KVCACHE_SPACE (whole GiB)
    enable_prefix_caching: bool = False
    enable_sleep_mode: bool = True  # CUDA only; vLLM refuses sleep mode on CPU


class EpisodeSettings(BaseModel):
    """Multi-turn tool episodes: the environment services this rollout service may dial, limits, timeouts."""

    model_config = ConfigDict(extra="forbid")

    # Environment service name → address. A request names a target, never an address (a caller must not
    # make the service dial arbitrary hosts); "default" serves requests that name none.
    targets: dict[str, str] = Field(default_factory=dict)
    max_turns: int = Field(8, ge=1)  # default and ceiling of Episode.max_turns
    max_tool_calls: int = Field(16, ge=0)  # default and ceiling of Episode.max_tool_calls
    max_calls_per_turn: int = Field(8, ge=1)  # more calls in one turn: the rest get error results
    open_timeout_s: float = Field(30.0, gt=0)  # OpenEpisode, GetReward and CloseEpisode deadline
    step_timeout_s: float = Field(60.0, gt=0)  # one Step (all calls of a turn)
    max_result_chars: int = Field(8192, ge=1)  # a tool result is cut to this before tokenizing


MiB = 1024 * 1024


class GatewaySettings(BaseModel):
    """The OpenAI-compatible HTTP gateway (``docs/agents.md``): its port and its bounds on hostile input."""

    model_config = ConfigDict(extra="forbid")

    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="HTTP port of /v1/chat/completions, /v1/completions, /v1/models and the same under "
        "/sessions/<id>/v1 (--openai-port); None = no gateway, 0 = any free port.",
    )
    serve_without_session: bool = Field(
        True,
        description="Serve /v1/... outside a session (the current policy, as Generate does); false: only "
        "session paths are served, /v1/... is 404.",
    )
    served_model_name: str | None = Field(
        None,
        description="The model id /v1/models lists and answers carry; default: the model directory's name.",
    )
    max_body_bytes: int = Field(4 * MiB, ge=1024, description="Largest request body in bytes; more is 413.")
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds a connection has to send a request's headers; a slower one is closed.",
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="Seconds a request's body may take to arrive; a slower one is 408."
    )
    max_messages: int = Field(512, ge=1, description="Messages per chat request; more is 413.")
    max_tools: int = Field(128, ge=0, description="Tool definitions per chat request; more is 413.")
    max_n: int = Field(16, ge=1, description="Largest `n` (choices per request); more is 400.")
    max_tokens: int = Field(
        4096,
        ge=1,
        description="Largest max_tokens / max_completion_tokens, and the default when a request sets none "
        "(within what the context leaves); more is 400.",
    )
    max_sessions: int = Field(
        4096, ge=1, description="Sessions open at once; OpenAgentSession past it is RESOURCE_EXHAUSTED."
    )
    max_calls_per_session: int = Field(
        1024, ge=1, description="Model calls one session may make; more is 429 with Retry-After."
    )
    max_recorded_tokens: int = Field(
        1 << 26,
        ge=1,
        description="Token ids the open sessions' recorded calls hold in all (each call's prompt, its "
        "template rendering and its choices; a session's calls each hold their whole conversation, so "
        "this grows with calls × context). A call made when it is reached is 429 with Retry-After, "
        "nothing generated; closing sessions frees theirs.",
    )
    session_ttl_s: float = Field(
        3600.0, gt=0, description="Lifetime of a session (the default and ceiling of OpenAgentSession's ttl)."
    )


class RolloutSettings(BaseModel):
    """Engine and batching settings of the rollout service."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # model directory; --model overrides it
    engine: Literal["auto", "hf", "vllm"] = "auto"  # auto: vllm when it can run, else hf
    device: str = "auto"  # auto: cuda:0 when CUDA is available, else cpu
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = (
        "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    )
    max_batch_size: int = Field(256, ge=1)  # sequences per forward pass (hf) / max_num_seqs (vllm)
    # HF engine: bytes of KV cache kept between an episode's turns and a gateway session's calls, for the
    # next call's prefill; past it the least recently used sessions' caches go (their next call is
    # prefilled whole). 0: keep none. vLLM manages its own (vllm.enable_prefix_caching).
    session_cache_bytes: int = Field(2 << 30, ge=0)
    max_model_len: int | None = Field(None, ge=2)  # default: the model's max_position_embeddings
    max_prompts: int = Field(4096, ge=1)  # prompts per Generate call
    # Work one Generate may ask for: sequences (prompts × n) and tokens (prompts × n × max_tokens,
    # and n × Σ (prompt tokens + max_tokens) once tokenized).
    max_request_sequences: int = Field(16384, ge=1)
    max_request_tokens: int = Field(1 << 20, ge=1)
    max_concurrent_generates: int = Field(64, ge=1)  # Generate calls queued or running at once
    # LoadWeights reads only regular files under this directory (relative: to the working
    # directory at start-up); a path outside it is PERMISSION_DENIED.
    weights_root: str = "."
    # Largest weight payload (UpdateWeights stream, LoadWeights file) in bytes; default: every
    # model parameter twice in float32 (a full-rank adapter of every matrix fits) + 1 MiB.
    max_weight_bytes: int | None = Field(None, ge=1)
    # Memory-backed directory shared with a trainer on the same host (/dev/shm/..., an emptyDir with
    # medium Memory): weight buckets are read from files there (SHARED_MEMORY transport). None: off.
    weight_shm_dir: str | None = None
    batch_window_ms: float = Field(5.0, ge=0)  # how long the batcher waits for concurrent calls
    # How long a batch waits, at most, for episodes whose environment call is in flight and gateway sessions
    # whose agent runs a tool (the calls that left one batch together come back as one); at least
    # batch_window_ms.
    batch_gather_ms: float = Field(50.0, ge=0)
    # A Generate call with continue_across_updates may pause for a weight update after every this many
    # generated tokens (and continue with the new weights).
    partial_segment_tokens: int = Field(8, ge=1)
    # How long a Generate call with min_policy_version waits, at most, for that version's weights to arrive
    # (a trainer sends the call while it pushes them); UNAVAILABLE after it.
    version_wait_s: float = Field(60.0, gt=0)
    seed: int = 0
    work_dir: str | None = None  # adapters and weight snapshots for vLLM; default: a temp dir
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    episodes: EpisodeSettings = Field(default_factory=EpisodeSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    # Images in chat prompts (ChatMessage.parts): per prompt and per image, checked before decoding.
    images: ImageLimits = Field(default_factory=ImageLimits)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda:0" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "float32" if self.resolved_device() == "cpu" else "bfloat16"
