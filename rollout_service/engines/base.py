"""The interface every generation engine implements.

Engines are synchronous and called from worker threads by the core, one call at a time for
weights/sleep (under the core's exclusive lock) and one ``generate`` batch at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from transformers import PreTrainedTokenizerBase, ProcessorMixin

from rollout_service.engines.session_caches import SessionCaches
from rollout_service.types import GenerationJob
from rollout_service.weights import ValidatedUpdate


def derive_seed(seed: int, prompt_index: int, sample_index: int = 0) -> int:
    """Seed of one prompt's (or one sequence's) sampling, derived from the request seed by
    splitmix-style mixing, so prompts of one request do not share a random stream."""
    x = seed * 0x9E3779B97F4A7C15 + prompt_index * 0xBF58476D1CE4E5B9 + sample_index * 0x94D049BB133111EB
    x &= (1 << 64) - 1
    x ^= x >> 31
    return x & ((1 << 63) - 1)


class UpdatePause(Protocol):
    """What an engine running a partial-rollout batch polls at segment boundaries. The core implements
    it (``core.versioning.UpdatePause``): engines see only this, so they never import the core.

    ``version``: the policy version sampling now. ``segment_tokens``: pause only after multiples of this
    many generated tokens. ``requested``: a weight update (or work it needs) waits.
    """

    version: int
    segment_tokens: int

    @property
    def requested(self) -> bool: ...

    def pause(self) -> int:
        """Let the waiting updates apply; returns the version serving afterwards (``self.version``)."""
        ...


class Engine(ABC):
    """A loaded policy that samples completions and takes new weights.

    Attributes set by implementations: ``name`` ("hf" / "vllm"), ``device`` ("cpu", "cuda:0"),
    ``model_dir``, ``max_model_len`` (prompt + completion tokens), ``tokenizer`` (the model's), ``processor``
    (a vision-language model's image processor and tokenizer; None for a text-only model).
    """

    tokenizer: PreTrainedTokenizerBase
    processor: ProcessorMixin | None = None
    name: str
    device: str
    model_dir: str
    max_model_len: int

    @abstractmethod
    def generate(self, jobs: list[GenerationJob], pause: UpdatePause | None = None) -> None:
        """Sample every job's completions in one batch, filling ``job.results`` prompt-major.

        A job whose ``cancel`` token is set stops between decode steps; its results are then
        incomplete and ignored by the caller.

        ``pause`` (a batch of partial rollouts only): after every ``pause.segment_tokens`` generated
        tokens, if ``pause.requested``, call ``pause.pause()`` — the waiting weight update applies —
        and continue the unfinished sequences with the new weights, setting each result's
        ``token_versions`` from ``pause.version`` at the time each token was sampled.
        """

    @abstractmethod
    def apply_update(self, update: ValidatedUpdate) -> None:
        """Make a validated update the serving weights (LoRA replaces the previous adapter;
        a state dict overwrites the named parameters and drops any adapter)."""

    @abstractmethod
    def sleep(self, level: int) -> None:
        """Level 1: offload weights to host memory, free caches. Level 2: discard weights too."""

    @abstractmethod
    def wake_up(self, tags: set[str]) -> None:
        """Restore what sleep freed for ``tags`` ⊆ {"weights", "kv_cache"}."""

    def release_session(self, session: str) -> None:  # noqa: B027 - engines without session state
        """Forget what the engine kept for ``GenerationJob.session`` (its episode or session ended)."""

    @property
    def session_caches(self) -> SessionCaches | None:
        """The KV caches the engine keeps between a session's calls (None: it keeps none itself)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most engines need nothing
        """Release the engine's resources at shutdown."""
