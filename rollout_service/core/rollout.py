"""The rollout data plane: every RPC's logic, one method each, engine-independent.

``RolloutCore`` validates requests, batches generation through the scheduler under the shared
side of the weights lock, and runs weight updates and sleep/wake under its exclusive side, so a
completion never mixes weight versions and carries the version that produced it — unless its request
set ``continue_across_updates``: then an update pauses the batch at a segment boundary, applies, and
the batch continues with the new weights (``versioning.UpdatePause``); every token carries the version
that sampled it and the completion's ``policy_version`` is the oldest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from grpo_runtime.compute_thread import ComputeThread
from grpo_runtime.errors import FailedPrecondition, ResourceExhausted
from grpo_runtime.images import ImageLimits
from grpo_runtime.off_loop import off_loop_unless
from grpo_runtime.tokenizing import decode_text
from rollout_service import memory
from rollout_service.core.episodes import EnvironmentBackend, EpisodeRunner
from rollout_service.core.scheduler import BatchScheduler, Caller
from rollout_service.core.sleep import SleepState
from rollout_service.core.validation import RequestValidator, check_completions
from rollout_service.core.versioning import ReadWriteLock, UpdatePause, VersionState, VersionWaits
from rollout_service.core.weight_channel import WeightChannel
from rollout_service.engines.base import Engine
from rollout_service.settings import EpisodeSettings
from rollout_service.types import (
    CompletionResult,
    GenerateRequest,
    GenerationJob,
    SleepResult,
    StatusInfo,
    WakeResult,
    WeightFormat,
    WeightPayload,
    WeightsApplied,
    WeightTransport,
)
from rollout_service.weight_plane.buckets import tensors_in_buckets
from rollout_service.weight_plane.distributed import GroupSpec
from rollout_service.weight_plane.manifest import ChannelApplied, ChannelManifest, check_manifest
from rollout_service.weights import (
    ParamCatalog,
    ValidatedUpdate,
    read_directory,
    validate_payload,
    validate_tensors,
)

# A request of token ids up to this many in all is checked on the event loop, and results up to this many
# sampled tokens are decoded there (each well under a millisecond).
INLINE_TOKENS = 4096


def small_prompts(request: GenerateRequest) -> bool:
    """Whether every prompt is token ids and they are at most ``INLINE_TOKENS`` in all (no template to
    render, no text to tokenize)."""
    if any(p.messages or p.text for p in request.prompts):
        return False
    return sum(len(p.token_ids) for p in request.prompts) <= INLINE_TOKENS


class RolloutCore:
    """``max_concurrent_generates``: Generate calls admitted at once (queued or running); one
    more is RESOURCE_EXHAUSTED. ``weights_root`` / ``max_weight_bytes``: where LoadWeights may
    read and the largest payload either weight RPC takes (None: ``catalog.max_payload_bytes``).
    ``environments``: the environment services episodes may use, by target name (``episode_settings``
    holds their limits and timeouts). ``partial_segment_tokens``: a partial-rollout batch may pause for
    a weight update after every this many generated tokens. ``compute``: the thread that runs every call
    into the engine and every tensor validation (:mod:`grpo_runtime.compute_thread`: one OpenMP pool per
    process; the engine should have been built on it too); default, one of its own. ``image_limits``:
    what one prompt may carry in images (the service's ``images`` settings). ``version_wait_s``: how long a
    request with ``min_policy_version`` waits for that version at most.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        catalog: ParamCatalog,
        *,
        max_prompts: int = 4096,
        max_request_sequences: int = 16384,
        max_request_tokens: int = 1 << 20,
        max_concurrent_generates: int = 64,
        weights_root: str | Path = ".",
        max_weight_bytes: int | None = None,
        batch_window_s: float = 0.005,
        batch_gather_s: float = 0.05,
        max_batch_rows: int = 256,
        environments: Mapping[str, EnvironmentBackend] | None = None,
        episode_settings: EpisodeSettings | None = None,
        weight_channel: WeightChannel | None = None,
        partial_segment_tokens: int = 8,
        compute: ComputeThread | None = None,
        image_limits: ImageLimits | None = None,
        version_wait_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.compute = compute or ComputeThread("rollout-engine")
        self.tokenizer = tokenizer
        self.catalog = catalog
        self.vocab_size = catalog.shapes.get("model.embed_tokens.weight", (len(tokenizer),))[0]
        self.validator = RequestValidator(
            tokenizer,
            engine.max_model_len,
            self.vocab_size,
            max_prompts,
            max_request_sequences=max_request_sequences,
            max_request_tokens=max_request_tokens,
            image_limits=image_limits or ImageLimits(),
            processor=engine.processor,
        )
        self.max_concurrent_generates = max_concurrent_generates
        self.generates_in_flight = 0
        self.weights_root = Path(weights_root).resolve()
        self.max_weight_bytes = max_weight_bytes or catalog.max_payload_bytes
        # The weight data plane (default: no shared memory; a group can still be joined).
        self.channel = weight_channel or WeightChannel(None, engine.device)
        self._channel_lock = asyncio.Lock()
        self.versions = VersionState()
        self.version_waits = VersionWaits(self.versions, version_wait_s)
        self.sleep_state = SleepState()
        self._lock = ReadWriteLock()
        if partial_segment_tokens < 1:
            raise ValueError(f"partial_segment_tokens must be >= 1, got {partial_segment_tokens}")
        self.partial_segment_tokens = partial_segment_tokens
        self._scheduler = BatchScheduler(
            self._run_batch, window_s=batch_window_s, gather_s=batch_gather_s, max_rows=max_batch_rows
        )
        self.episodes = EpisodeRunner(
            self._generate_turn,
            tokenizer,
            self.validator,
            environments or {},
            episode_settings or EpisodeSettings(),
            release_session=engine.release_session,
            served_version=lambda: self.versions.policy_version,
            register=self._scheduler.caller,
        )

    def register_caller(self) -> Caller:
        """A handle for a caller that will call :meth:`generate` again and again (``scheduler.Caller``)."""
        return self._scheduler.caller()

    async def start(self) -> None:
        self._scheduler.start()

    async def close(self) -> None:
        await self._scheduler.close()
        await self.episodes.close()
        await asyncio.to_thread(self.channel.shutdown)
        await self.compute.run(self.engine.close)
        await asyncio.to_thread(self.compute.close)

    # --------------------------------------------------------------- generate
    async def generate(
        self, request: GenerateRequest, caller: Caller | None = None, session: str | None = None
    ) -> list[CompletionResult]:
        """Sample ``n`` completions per prompt, prompt-major; ``caller``: the registered caller making it
        (:meth:`register_caller`); ``session``: a key under which the engine may keep the KV cache of a
        sequence it samples for a later call whose prompt extends it (``GenerationJob.session``), until
        :meth:`release_session`.

        Tokenizing, decoding and checking run in worker threads: a request of thousands of long
        prompts must not hold the event loop that serves every other caller. Those of a request of token
        ids, and decoding results, up to ``INLINE_TOKENS`` in all run on the loop (``grpo_runtime.off_loop``).
        """
        if self.generates_in_flight >= self.max_concurrent_generates:
            raise ResourceExhausted(
                f"{self.generates_in_flight} Generate calls are in flight, the server's limit "
                f"max_concurrent_generates is {self.max_concurrent_generates}; retry later",
                retry_after_s=0.5,
            )
        self.generates_in_flight += 1
        try:
            if any(p.episode is not None for p in request.prompts):
                sampling = await asyncio.to_thread(self.episodes.check, request)
                self.sleep_state.check_generate()
                return await self.episodes.run(request, sampling)
            job = await off_loop_unless(small_prompts(request), self.validator.to_job, request)
            job.session = session
            await self.version_waits.reach(job.min_policy_version)
            self.sleep_state.check_generate()
            await self._scheduler.submit(job, caller)
            small = sum(len(raw.token_ids) for raw in job.results) <= INLINE_TOKENS
            return await off_loop_unless(small, self._completions, request, job)
        finally:
            self.generates_in_flight -= 1

    def release_session(self, session: str) -> None:
        """Forget what the engine kept for ``session`` (:meth:`generate`)."""
        self.engine.release_session(session)

    async def _generate_turn(self, job: GenerationJob, caller: Caller) -> None:
        """One turn of an episode: a one-row job through the same batches as every Generate call."""
        await self.version_waits.reach(job.min_policy_version)
        self.sleep_state.check_generate()
        await self._scheduler.submit(job, caller)
        check_completions(job.results, self.vocab_size, job.n)

    def _completions(self, request: GenerateRequest, job: GenerationJob) -> list[CompletionResult]:
        """The engine's raw results checked and turned into CompletionResults."""
        check_completions(job.results, self.vocab_size, job.n)
        version = job.policy_version
        out = []
        for k, raw in enumerate(job.results):
            prompt_index = k // job.n
            text = raw.text
            if text is None:
                text = decode_text(self.tokenizer, raw.token_ids, skip_special_tokens=True)
            assert raw.token_versions is not None  # filled in by _run_batch
            out.append(
                CompletionResult(
                    prompt_id=request.prompts[prompt_index].id,
                    prompt_token_ids=job.prompt_token_ids[prompt_index],
                    token_ids=raw.token_ids,
                    text=text,
                    logprobs=raw.logprobs,
                    finish_reason=raw.finish_reason,
                    policy_version=min(raw.token_versions, default=version),
                    token_versions=raw.token_versions,
                )
            )
        return out

    async def _run_batch(self, jobs: list[GenerationJob]) -> None:
        """One engine batch under the read lock; fills every result's ``token_versions``.

        The scheduler never mixes partial-rollout jobs with others, so the first job says which the batch is.
        """
        async with self._lock.read():
            # Re-checked here: a Sleep may have run while the jobs waited in the queue.
            self.sleep_state.check_generate()
            version = self.versions.policy_version
            if jobs[0].continue_across_updates:
                pause = UpdatePause(
                    self._lock,
                    asyncio.get_running_loop(),
                    self.compute,
                    lambda: self.versions.policy_version,
                    self.partial_segment_tokens,
                )
                await self.compute.run(self.engine.generate, jobs, pause)
            else:
                await self.compute.run(self.engine.generate, jobs)
            for job in jobs:
                job.policy_version = version
                for raw in job.results:
                    if raw.token_versions is None:
                        raw.token_versions = [version] * len(raw.token_ids)

    # ---------------------------------------------------------------- weights
    async def update_weights(self, payload: WeightPayload) -> WeightsApplied:
        """Validate a streamed payload fully, then apply it between batches (all-or-nothing).

        ``apply_seconds`` is the contract's "time from the last chunk to the new weights
        serving": checksum comparison, parsing, validation, waiting for the batches in flight
        and the engine's apply.
        """
        start = time.perf_counter()
        with self.version_waits.update_to(payload.version):
            self.versions.check_next(payload.version)
            self.sleep_state.check_weight_update()
            update = await self.compute.run(validate_payload, payload, self.catalog)
            applied = await self._apply(update, start)
        return WeightsApplied(
            applied.policy_version, applied.tensors_loaded, applied.apply_seconds, len(payload.data)
        )

    async def load_weights(self, path: str, version: int, fmt: WeightFormat) -> WeightsApplied:
        """Read and validate weights from a directory under ``weights_root``, then apply them like
        an update. A root of ``/`` (the default, the working directory, in a container without
        a WORKDIR) would confine nothing, so LoadWeights is refused until one is configured."""
        if self.weights_root == Path(self.weights_root.anchor):
            raise FailedPrecondition(
                f"weights_root is {str(self.weights_root)!r}, which confines nothing; set weights_root "
                "to the directory shared with the trainer"
            )
        with self.version_waits.update_to(version):
            self.versions.check_next(version)
            self.sleep_state.check_weight_update()
            update = await self.compute.run(
                read_directory, path, version, fmt, self.catalog, self.weights_root, self.max_weight_bytes
            )
            return await self._apply(update)

    async def open_weight_channel(
        self, transport: WeightTransport, spec: GroupSpec | None
    ) -> WeightTransport:
        """Join the trainer's data plane (a second Open replaces the first); joining a group runs in
        a thread of its own, waited for at most ``spec.timeout_s`` (DEADLINE_EXCEEDED after it)."""
        self.channel.check_open(transport, spec)
        async with self._channel_lock:
            if transport == WeightTransport.SHARED_MEMORY:
                self.channel.open_shared_memory()
            else:
                assert spec is not None
                await self.channel.join_group(spec)
        return self.channel.transport

    async def close_weight_channel(self) -> None:
        async with self._channel_lock:
            await asyncio.to_thread(self.channel.close)

    async def update_weights_from_channel(self, manifest: ChannelManifest) -> ChannelApplied:
        """Take the buckets off the open channel, validate them as an update, apply (all-or-nothing).

        The manifest is checked before any byte moves; refused then on a group, the channel is left
        (the trainer's broadcast fails at once instead of waiting for this replica). The tensors are
        views into the buckets, validated by the same path as UpdateWeights' payload."""
        with self.version_waits.update_to(manifest.version):
            return await self._update_from_channel(manifest)

    async def _update_from_channel(self, manifest: ChannelManifest) -> ChannelApplied:
        start = time.perf_counter()
        transport = self.channel.require()
        try:
            self.versions.check_next(manifest.version)
            self.sleep_state.check_weight_update()
            check_manifest(manifest, self.max_weight_bytes, self.catalog.shapes)
        except Exception:
            if transport == WeightTransport.TORCH_DISTRIBUTED:
                await self.close_weight_channel()
            raise
        async with self._channel_lock:
            buckets = await asyncio.to_thread(self.channel.receive, manifest)
            arrived = time.perf_counter()
            update = await self.compute.run(
                validate_tensors,
                manifest.version,
                manifest.format,
                tensors_in_buckets(manifest, buckets),
                manifest.adapter_config_json,
                self.catalog,
                manifest.total_bytes,
            )
            applied = await self._apply(update, arrived)
        return ChannelApplied(
            applied.policy_version,
            applied.tensors_loaded,
            manifest.total_bytes,
            arrived - start,
            applied.apply_seconds,
            transport,
        )

    async def _apply(self, update: ValidatedUpdate, start: float | None = None) -> WeightsApplied:
        """Apply under the exclusive lock; ``apply_seconds`` counts from ``start`` (default: now)."""
        start = time.perf_counter() if start is None else start
        async with self._lock.write(preempts_partial=True):
            # Checked again under the lock: a concurrent update or sleep may have won the race.
            self.versions.check_next(update.version)
            self.sleep_state.check_weight_update()
            await self.compute.run(self.engine.apply_update, update)
            self.versions.advance(update.version, update.format)
            self.sleep_state.weights_loaded()
        return WeightsApplied(update.version, update.num_tensors, time.perf_counter() - start, update.nbytes)

    # ------------------------------------------------------------------ sleep
    async def sleep(self, level: int) -> SleepResult:
        """Free memory for a colocated trainer; waits for the batches in flight."""
        before = await asyncio.to_thread(memory.measure)
        async with self._lock.write():
            if self.sleep_state.check_sleep(level):
                await self.compute.run(self.engine.sleep, level)
                self.sleep_state.enter(level)
        after = await asyncio.to_thread(memory.measure)
        return SleepResult(level, before, after)

    async def wake_up(self, tags: list[str]) -> WakeResult:
        wanted = SleepState.parse_tags(tags)
        start = time.perf_counter()
        async with self._lock.write():
            to_wake = wanted & self.sleep_state.sleeping_tags
            if to_wake:
                await self.compute.run(self.engine.wake_up, to_wake)
                self.sleep_state.wake(to_wake)
        elapsed = time.perf_counter() - start
        return WakeResult(self.sleep_state.weights_valid, await asyncio.to_thread(memory.measure), elapsed)

    # ----------------------------------------------------------------- status
    def status(self) -> StatusInfo:
        return StatusInfo(
            engine=self.engine.name,
            device=self.engine.device,
            model=self.engine.model_dir,
            policy_version=self.versions.policy_version,
            sleep_level=self.sleep_state.level,
            sleeping_tags=tuple(sorted(self.sleep_state.sleeping_tags)),
            weights_valid=self.sleep_state.weights_valid,
            memory=memory.measure(),
            max_model_len=self.engine.max_model_len,
            weight_format=self.versions.weight_format,
            weight_transport=self.channel.transport,
            weight_transports=self.channel.supported,
            weight_shm_dir=str(self.channel.shm.directory) if self.channel.shm else "",
            weight_shm_token=self.channel.shm.token if self.channel.shm else "",
        )
