"""Domain objects of the rollout service, shared by the api, core and engine layers."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from grpo_runtime.chat_codec import MessageContent


class FinishReason(enum.IntEnum):
    """Why a completion ended (values equal the protobuf enum's)."""

    UNSPECIFIED = 0
    STOP = 1  # EOS token or a stop string
    LENGTH = 2  # max_tokens reached
    ABORT = 3  # stopped by the service
    TURN_LIMIT = 4  # episode: max_turns or max_tool_calls reached while the model still called tools
    ERROR = 5  # episode: the environment failed; CompletionResult.error says why


class WeightFormat(enum.IntEnum):
    """Payload kind of a weight update (values equal the protobuf enum's)."""

    UNSPECIFIED = 0
    LORA_ADAPTER = 1
    STATE_DICT = 2


class WeightTransport(enum.IntEnum):
    """How a weight update's bytes travel (values equal the protobuf enum's)."""

    UNSPECIFIED = 0
    GRPC_STREAM = 1
    SHARED_MEMORY = 2
    TORCH_DISTRIBUTED = 3


@dataclass(frozen=True)
class SamplingSpec:
    """Validated sampling parameters of one Generate call.

    ``temperature`` 0 means greedy; ``top_k`` 0 and ``top_p`` 1 and ``min_p`` 0 mean off;
    ``seed`` None means nondeterministic.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repetition_penalty: float = 1.0
    min_tokens: int = 0


@dataclass(frozen=True)
class EpisodeSpec:
    """A prompt's request for a multi-turn tool episode (validated by the episode runner).

    ``max_turns`` / ``max_tool_calls`` None: the server's defaults; ``target``: a configured
    environment service name ("" = "default"), never an address; ``skip_reward``: the caller does not use
    the environment's reward (no GetReward call, ``env_reward`` None).
    """

    environment: str
    params: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    max_tool_calls: int | None = None
    target: str = ""
    skip_reward: bool = False


@dataclass(frozen=True)
class PromptInput:
    """One prompt in any of its three forms (exactly one must be set; checked by validation)."""

    id: str = ""
    messages: tuple[tuple[str, MessageContent], ...] = ()  # (role, content) pairs
    text: str = ""
    token_ids: tuple[int, ...] = ()
    episode: EpisodeSpec | None = None


@dataclass(frozen=True)
class GenerateRequest:
    """A Generate call as the api layer hands it to the core (not yet validated)."""

    prompts: tuple[PromptInput, ...]
    n: int
    sampling: SamplingSpec
    # A weight update may take the lock between segments of this call's tokens (a partial rollout).
    continue_across_updates: bool = False
    # Generation waits until at least this policy version serves (None: whatever serves).
    min_policy_version: int | None = None


@dataclass
class CompletionResult:
    """One generated completion.

    ``logprobs[i]`` = log p(token_ids[i]) under log_softmax(logits / T) (untempered when T = 0),
    the quantity TRL recomputes in the trainer; same length as ``token_ids``.
    """

    prompt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    # Episodes only (empty / zero / None otherwise): see the Completion message of rollout.proto.
    tool_mask: list[int] = field(default_factory=list)
    turns: list[TurnSpan] = field(default_factory=list)
    tool_call_count: int = 0
    tool_failure_count: int = 0
    env_reward: float | None = None
    error: str = ""
    # One per token of ``token_ids``: the version whose weights sampled it (``policy_version`` is the oldest).
    token_versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TurnSpan:
    """One model turn of an episode: ``token_ids[start:end]`` sampled at ``policy_version``."""

    start: int
    end: int
    policy_version: int
    tool_calls: int = 0


@dataclass
class RawCompletion:
    """What an engine returns for one sampled sequence (text and version are added by the core)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str | None = None  # set by engines that decode and cut stop strings themselves
    # One per token: the version that sampled it, set by an engine that paused for an update mid-sequence
    # (None: the whole sequence is of the batch's version, filled in by the core).
    token_versions: list[int] | None = None


class CancelToken:
    """Set when the caller of a generation went away (cancelled call, exceeded deadline).

    Engines poll ``cancelled`` between decode steps (a thread-safe flag, since engines run
    in worker threads while the event loop sets it).
    """

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass(frozen=True)
class PromptImages:
    """A prompt's pictures, in the two forms the engines take them.

    ``inputs``: the model processor's tensors for the prompt (``pixel_values`` and any other per-image
    tensor), which the HF engine feeds its model. ``pictures`` (decoded, in prompt order) and
    ``placeholder_ids`` (the rendered prompt's ids with each picture still one placeholder): what vLLM takes,
    running the same processor itself, which expands the placeholders to the job's ``prompt_token_ids``.
    """

    inputs: dict[str, Any]
    pictures: tuple[Image.Image, ...]
    placeholder_ids: list[int]


@dataclass
class GenerationJob:
    """One validated Generate call queued for the engine: tokenized prompts × ``n``.

    ``results`` is filled by the engine prompt-major: ``results[i * n + j]`` is sample j of
    prompt i.
    """

    prompt_token_ids: list[list[int]]
    n: int
    sampling: SamplingSpec
    cancel: CancelToken = field(default_factory=CancelToken)
    # An episode's or a gateway session's key: the engine may keep the KV cache of a sequence of this job for
    # the next call, whose prompt extends it, until ``Engine.release_session`` (of several rows, one of them;
    # a prompt that extends none of it is prefilled whole).
    session: str | None = None
    results: list[RawCompletion] = field(default_factory=list)
    policy_version: int = 0  # set by the core: the version that served the batch (when it started)
    # The engine may pause this job at a segment boundary for a weight update and continue with the new
    # weights (``GenerateRequest.continue_across_updates``); jobs with and without it never share a batch.
    continue_across_updates: bool = False
    # The job is submitted once at least this policy version serves (``GenerateRequest.min_policy_version``).
    min_policy_version: int | None = None
    # Per prompt, its pictures (None for a text prompt); an empty list: every prompt is text.
    images: list[PromptImages | None] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.prompt_token_ids) * self.n


@dataclass(frozen=True)
class WeightPayload:
    """A weight update as received: the safetensors bytes and the header of the stream.

    ``sha256`` and ``total_bytes`` are the sender's declarations, checked before parsing
    (empty / 0 = not declared for ``total_bytes``; the checksum is required).
    ``data`` is any bytes-like object; a writable one (the receive buffer) is parsed without
    a copy. ``received_sha256``: the hex SHA-256 of ``data`` when the receiver already
    computed it while the chunks arrived (empty = compute it during validation).
    """

    version: int
    format: WeightFormat
    data: bytes | bytearray | memoryview
    sha256: str = ""
    total_bytes: int = 0
    adapter_config_json: str = ""
    received_sha256: str = ""


@dataclass(frozen=True)
class MemoryUsage:
    """Memory in bytes: RSS of the service process and its engine child processes, CUDA counters."""

    rss_bytes: int
    cuda_allocated_bytes: int = 0
    cuda_reserved_bytes: int = 0


@dataclass(frozen=True)
class StatusInfo:
    """What GetStatus reports."""

    engine: str
    device: str
    model: str
    policy_version: int
    sleep_level: int
    sleeping_tags: tuple[str, ...]
    weights_valid: bool
    memory: MemoryUsage
    max_model_len: int
    weight_format: WeightFormat
    # The transport the next weight push uses, those this replica can join, and its shared-memory
    # directory and token (empty without one).
    weight_transport: WeightTransport = WeightTransport.GRPC_STREAM
    weight_transports: tuple[WeightTransport, ...] = (WeightTransport.GRPC_STREAM,)
    weight_shm_dir: str = ""
    weight_shm_token: str = ""
    openai_port: int = 0  # the gateway's bound port; 0 = no gateway


@dataclass(frozen=True)
class WeightsApplied:
    """Result of a weight update or load."""

    policy_version: int
    tensors_loaded: int
    apply_seconds: float
    bytes_received: int = 0


@dataclass(frozen=True)
class SleepResult:
    level: int
    memory_before: MemoryUsage
    memory_after: MemoryUsage


@dataclass(frozen=True)
class WakeResult:
    weights_valid: bool
    memory: MemoryUsage
    wake_seconds: float
