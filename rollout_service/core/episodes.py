"""Multi-turn tool episodes: generate → parse tool calls → Step → append the results → generate again.

One episode per (prompt, sample). Every turn is an ordinary one-row generation job submitted to the
core's batch scheduler, so the turns of all the episodes in flight (of this and of other requests) are
batched together by the engine. Each episode is a registered caller of the scheduler
(``scheduler.Caller``): while it waits on its environment (opening, a Step), the batch it will join waits
for it. The whole loop of an episode runs inside one Generate call, hence on one
replica: the KV cache of its earlier turns (HF) or the prefix cache (vLLM) is there for the next turn.

Token-in/token-out: the completion is the concatenation of the model's sampled ids, exactly as sampled,
and the tool-result ids rendered by the chat template (``tool_calls.ToolSuffixer``);
the model's text is decoded only to find tool calls, never re-tokenized. ``tool_mask`` is 1 on model ids
and 0 on tool-result ids, whose logprobs are 0 placeholders (TRL's ``tool_mask`` convention).
``token_versions``: a model id carries the version that sampled it (a turn of a ``continue_across_updates``
request may span an update); a tool-result id carries the version of the model's last token before it.

An episode ends when a turn has no tool call (its finish reason: STOP, or LENGTH when the budget ran out
mid-turn), when the token budget (``sampling.max_tokens`` over the whole completion) or the context cannot
take the tool results (LENGTH), at ``max_turns`` / ``max_tool_calls`` or after the environment said
``done`` while the model still calls tools (TURN_LIMIT), or when the environment fails — unreachable,
an RPC error, a Step past ``step_timeout_s`` — which ends that episode alone with ERROR and the reason.
Episodes are always closed, also when the request is cancelled: in the background, so the results go back
without waiting for the environment's CloseEpisode (closing the runner waits for them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase

from grpo_runtime.env_types import Episode, EpisodeReward, StepOutcome, ToolCall, ToolResult
from grpo_runtime.errors import InvalidArgument
from grpo_runtime.off_loop import off_loop_unless
from grpo_runtime.tokenizing import decode_text
from rollout_service.core.scheduler import Caller
from rollout_service.core.tool_calls import ParsedCall, ToolSuffixer, malformed_result, parse_tool_calls
from rollout_service.core.validation import RequestValidator
from rollout_service.engines.base import derive_seed
from rollout_service.settings import EpisodeSettings
from rollout_service.types import (
    CompletionResult,
    EpisodeSpec,
    FinishReason,
    GenerateRequest,
    GenerationJob,
    PromptInput,
    SamplingSpec,
    TurnSpan,
)

log = logging.getLogger(__name__)

DEFAULT_TARGET = "default"
# Tool results up to this many characters in all are rendered on the event loop (about 0.1 ms):
# grpo_runtime.off_loop.
INLINE_SUFFIX_CHARS = 4096


class EnvironmentBackend(Protocol):
    """What the loop needs of an environment service (``grpo_runtime.env_client.EnvironmentClient``
    over gRPC, or an in-process implementation)."""

    async def open_episode(
        self,
        environment: str,
        *,
        params: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode: ...

    async def step(self, episode_id: str, calls: Sequence[ToolCall]) -> StepOutcome: ...

    async def get_reward(self, episode_id: str) -> EpisodeReward: ...

    async def close_episode(self, episode_id: str) -> bool: ...

    async def close(self) -> None:
        """Release the backend (its channel) at shutdown."""


# Runs one job of one row of an episode (its scheduler caller) through the engine: fills ``job.results`` and
# ``job.policy_version``.
TurnGenerator = Callable[[GenerationJob, Caller], Awaitable[None]]


class EnvironmentFailure(Exception):
    """The environment service failed for one episode; the message is the completion's ``error``."""


@dataclass
class EpisodeState:
    """One episode's completion as it grows; ``tokens``, ``logprobs`` and ``tool_mask`` stay aligned."""

    prompt_ids: list[int]
    session: str = ""  # the engine's key for this episode's KV cache between turns
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    turns: list[TurnSpan] = field(default_factory=list)
    tool_calls: int = 0
    tool_failures: int = 0
    finish: FinishReason = FinishReason.ABORT
    error: str = ""
    env_reward: float | None = None

    def append(self, ids: list[int], logprobs: list[float] | None, versions: list[int] | None = None) -> None:
        """Model ids with their logprobs and versions, or tool-result ids (``logprobs`` None: 0 placeholders,
        mask 0, the version of the token before them)."""
        self.tokens += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.tool_mask += [1 if logprobs is not None else 0] * len(ids)
        if versions is None:
            last = self.token_versions[-1] if self.token_versions else self.turns[-1].policy_version
            versions = [last] * len(ids)
        self.token_versions += versions


class _SharedRenders:
    """The prompts of one request rendered with their episodes' tools, each once: the G episodes of a
    prompt whose environment gave them the same tools and prompt suffix share one render off the loop."""

    def __init__(self) -> None:
        self._renders: dict[int, list[tuple[Episode, asyncio.Future[list[int]]]]] = {}

    async def prompt_ids(
        self,
        index: int,
        episode: Episode,
        render: Callable[[PromptInput, Episode, int], list[int]],
        prompt: PromptInput,
    ) -> list[int]:
        shared = self._renders.setdefault(index, [])
        same = (
            ids
            for other, ids in shared
            if (other.prompt_suffix, other.tools) == (episode.prompt_suffix, episode.tools)
        )
        ids = next(same, None)
        if ids is None:
            ids = asyncio.ensure_future(asyncio.to_thread(render, prompt, episode, index))
            shared.append((episode, ids))
        # Shielded: an episode cancelled while waiting leaves the render to the others.
        return list(await asyncio.shield(ids))


class EpisodeRunner:
    """Runs the episodes of Generate calls whose prompts ask for them.

    ``environments``: target name → backend (the configured services; see ``EpisodeSettings.targets``);
    ``served_version``: the policy version being served now (that of an episode that ended before a turn);
    ``register``: an episode's caller handle with the scheduler that batches its turns.
    """

    def __init__(
        self,
        generate_turn: TurnGenerator,
        tokenizer: PreTrainedTokenizerBase,
        validator: RequestValidator,
        environments: Mapping[str, EnvironmentBackend],
        settings: EpisodeSettings,
        release_session: Callable[[str], None] = lambda session: None,
        served_version: Callable[[], int] = lambda: 0,
        *,
        register: Callable[[], Caller],
    ) -> None:
        self._generate_turn = generate_turn
        self._register = register
        self._served_version = served_version
        self._release_session = release_session
        self._tokenizer = tokenizer
        self._validator = validator
        self._environments = environments
        self._settings = settings
        self._suffixer = ToolSuffixer(tokenizer)
        self._closing: set[asyncio.Task[None]] = set()  # CloseEpisode calls in flight

    async def close(self) -> None:
        if self._closing:
            await asyncio.wait(self._closing)
        for env in self._environments.values():
            await env.close()

    # ------------------------------------------------------------ validation
    def check(self, request: GenerateRequest) -> SamplingSpec:
        """Refuse a malformed episode request before any episode opens; returns the validated sampling.

        The prompts are also tokenized without tools here, so every size limit of a plain request holds.
        """
        job = self._validator.to_job(request)
        for i, prompt in enumerate(request.prompts):
            where = f"prompts[{i}].episode"
            spec = prompt.episode
            if spec is None:
                raise InvalidArgument("set on some prompts of the request but not on this one", field=where)
            if not prompt.messages:
                raise InvalidArgument(
                    "an episode needs chat messages (tools are rendered by the chat template)",
                    field=f"prompts[{i}].messages",
                )
            if not spec.environment:
                raise InvalidArgument("must name an environment", field=f"{where}.environment")
            target = spec.target or DEFAULT_TARGET
            if target not in self._environments:
                known = ", ".join(sorted(self._environments)) or "none configured"
                raise InvalidArgument(
                    f"unknown environment target {target!r} (this server's targets: {known})",
                    field=f"{where}.target",
                )
            if spec.max_turns is not None and not 1 <= spec.max_turns <= self._settings.max_turns:
                raise InvalidArgument(
                    f"must be in [1, {self._settings.max_turns}] (the server's episodes.max_turns), "
                    f"got {spec.max_turns}",
                    field=f"{where}.max_turns",
                )
            if spec.max_tool_calls is not None and spec.max_tool_calls > self._settings.max_tool_calls:
                raise InvalidArgument(
                    f"must be <= {self._settings.max_tool_calls} (the server's episodes.max_tool_calls), "
                    f"got {spec.max_tool_calls}",
                    field=f"{where}.max_tool_calls",
                )
        return job.sampling

    # ------------------------------------------------------------------- run
    async def run(self, request: GenerateRequest, sampling: SamplingSpec) -> list[CompletionResult]:
        """All episodes of a checked request, concurrently; prompt-major results. A failure that is not one
        episode's (the engine's, a cancelled call) stops every episode of the request."""
        renders = _SharedRenders()
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._episode(prompt, i, j, sampling, request, renders))
                    for i, prompt in enumerate(request.prompts)
                    for j in range(request.n)
                ]
        except ExceptionGroup as group_error:
            # The first failure is the request's (a domain error keeps its status code); the others are
            # episodes cancelled because of it.
            raise group_error.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _episode(
        self,
        prompt: PromptInput,
        index: int,
        sample: int,
        sampling: SamplingSpec,
        request: GenerateRequest,
        renders: _SharedRenders,
    ) -> CompletionResult:
        spec = prompt.episode
        assert spec is not None  # checked
        env = self._environments[spec.target or DEFAULT_TARGET]
        state = EpisodeState(prompt_ids=[], session=uuid.uuid4().hex)
        episode: Episode | None = None
        caller = self._register()
        try:
            episode = await self._call(
                env.open_episode(spec.environment, params=spec.params, metadata=spec.metadata),
                "OpenEpisode",
                self._settings.open_timeout_s,
            )
            state.prompt_ids = await renders.prompt_ids(index, episode, self._prompt_ids, prompt)
            if len(state.prompt_ids) + 1 > self._validator.max_model_len:
                raise EnvironmentFailure(
                    f"the prompt with the environment's tools is {len(state.prompt_ids)} tokens, no room in "
                    f"the model's context of {self._validator.max_model_len}"
                )
            await self._turns(
                state, spec, episode, env, caller, sampling, index * 1_000_003 + sample, request
            )
            caller.close()  # no more turns: batches stop waiting for it
            if not spec.skip_reward:
                state.env_reward = await self._reward(env, episode)
        except EnvironmentFailure as failure:
            state.finish, state.error = FinishReason.ERROR, str(failure)
            if not state.prompt_ids:
                # It failed before the prompt was rendered with the environment's tools: the prompt without
                # them, so that the completion still has the prompt a trainer batches it with.
                state.prompt_ids = await asyncio.to_thread(self._validator.tokenize, prompt, index)
        finally:
            caller.close()
            self._release_session(state.session)
            if episode is not None:
                closing = asyncio.get_running_loop().create_task(self._close(env, episode))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        return self._result(prompt, state)

    async def _turns(
        self,
        state: EpisodeState,
        spec: EpisodeSpec,
        episode: Episode,
        env: EnvironmentBackend,
        caller: Caller,
        sampling: SamplingSpec,
        stream: int,
        request: GenerateRequest,
    ) -> None:
        max_turns = spec.max_turns or self._settings.max_turns
        max_calls = spec.max_tool_calls if spec.max_tool_calls is not None else self._settings.max_tool_calls
        env_done = False
        while True:
            turn = len(state.turns)
            seed = None if sampling.seed is None else derive_seed(sampling.seed, stream, turn)
            budget = sampling.max_tokens - len(state.tokens)
            job = GenerationJob(
                [state.prompt_ids + state.tokens],
                1,
                dataclasses.replace(sampling, max_tokens=budget, seed=seed),
                session=state.session,
                continue_across_updates=request.continue_across_updates,
                min_policy_version=request.min_policy_version,
            )
            await self._generate_turn(job, caller)
            raw = job.results[0]
            start = len(state.tokens)
            versions = raw.token_versions or [job.policy_version] * len(raw.token_ids)
            state.append(raw.token_ids, raw.logprobs, versions)
            parsed: list[ParsedCall] = []
            if raw.finish_reason == FinishReason.STOP:
                parsed = parse_tool_calls(decode_text(self._tokenizer, raw.token_ids))
            # The turn's version is its oldest token's (that of the batch that started it).
            state.turns.append(TurnSpan(start, len(state.tokens), job.policy_version, len(parsed)))
            if raw.finish_reason == FinishReason.ABORT or not parsed:
                state.finish = raw.finish_reason
                return
            if env_done or turn + 1 >= max_turns or state.tool_calls + len(parsed) > max_calls:
                state.finish = FinishReason.TURN_LIMIT
                return
            state.tool_calls += len(parsed)
            try:
                outcome = await self._step(env, episode, parsed)
            except EnvironmentFailure:
                state.tool_failures += len(parsed)  # the model's calls were made; none got a result
                raise
            state.tool_failures += sum(r.error for r in outcome.results)
            results = list(outcome.results)
            small = sum(len(r.content) for r in results) <= INLINE_SUFFIX_CHARS
            suffix = await off_loop_unless(small, self._suffixer.suffix_ids, results)
            # The next turn needs room for at least one token (TRL drops results that would overflow).
            if (
                len(state.tokens) + len(suffix) >= sampling.max_tokens
                or len(state.prompt_ids) + len(state.tokens) + len(suffix) >= self._validator.max_model_len
            ):
                state.finish = FinishReason.LENGTH
                return
            state.append(suffix, None)
            env_done = outcome.done

    async def _step(self, env: EnvironmentBackend, episode: Episode, parsed: list[ParsedCall]) -> StepOutcome:
        """One result per parsed block, in order: malformed blocks and calls past ``max_calls_per_turn`` get
        error results here; the rest go to the environment in one Step."""
        cap = self._settings.max_calls_per_turn
        sendable = [p.call for p in parsed[:cap] if not p.error]
        outcome = StepOutcome((), False)
        if sendable:
            outcome = await self._call(
                env.step(episode.episode_id, sendable), "Step", self._settings.step_timeout_s
            )
            if len(outcome.results) != len(sendable):
                raise EnvironmentFailure(
                    f"Step returned {len(outcome.results)} results for {len(sendable)} tool calls"
                )
        from_env = iter(outcome.results)
        results = []
        for k, p in enumerate(parsed):
            if k >= cap:
                results.append(
                    ToolResult(
                        p.call.id, p.call.name, f"error: more than {cap} tool calls in one turn", error=True
                    )
                )
            elif p.error:
                results.append(malformed_result(p))
            else:
                results.append(self._cut(next(from_env)))
        return StepOutcome(tuple(results), outcome.done)

    def _cut(self, result: ToolResult) -> ToolResult:
        limit = self._settings.max_result_chars
        if len(result.content) <= limit:
            return result
        return dataclasses.replace(result, content=result.content[:limit], truncated=True)

    async def _reward(self, env: EnvironmentBackend, episode: Episode) -> float | None:
        reward = await self._call(
            env.get_reward(episode.episode_id), "GetReward", self._settings.open_timeout_s
        )
        if reward.error:
            log.warning("environment reward of episode %s failed: %s", episode.episode_id, reward.error)
        return reward.value

    async def _close(self, env: EnvironmentBackend, episode: Episode) -> None:
        """Best effort and bounded: the server also expires idle episodes."""
        try:
            async with asyncio.timeout(self._settings.open_timeout_s):
                await env.close_episode(episode.episode_id)
        except Exception as exc:
            log.warning("closing episode %s failed: %s", episode.episode_id, exc)

    @staticmethod
    async def _call(coro: Awaitable[Any], what: str, timeout_s: float) -> Any:
        """An environment call bounded by ``timeout_s``; any failure becomes this episode's error."""
        try:
            async with asyncio.timeout(timeout_s):
                return await coro
        except TimeoutError as exc:
            raise EnvironmentFailure(f"{what} timed out after {timeout_s:g} s") from exc
        except Exception as exc:
            raise EnvironmentFailure(f"{what} failed: {exc}") from exc

    # ------------------------------------------------------------- assembly
    def _prompt_ids(self, prompt: PromptInput, episode: Episode, index: int) -> list[int]:
        """The chat template over the messages with the tools and the environment's prompt suffix (appended to
        the last user message, as TRL appends ``reset``'s return value)."""
        messages = list(prompt.messages)
        if episode.prompt_suffix:
            last_user = max(
                (k for k, (role, _) in enumerate(messages) if role == "user"), default=len(messages) - 1
            )
            role, content = messages[last_user]
            suffixed = (
                content + episode.prompt_suffix
                if isinstance(content, str)
                else (*content, episode.prompt_suffix)
            )
            messages[last_user] = (role, suffixed)
        with_suffix = dataclasses.replace(prompt, messages=tuple(messages))
        return self._validator.tokenize(with_suffix, index, tools=episode.chat_template_tools() or None)

    def _result(self, prompt: PromptInput, state: EpisodeState) -> CompletionResult:
        # No turn (the environment failed first): no weights produced it, so it is of the version served now
        # and a trainer checking versions keeps it as the per-completion error it is.
        versions = [t.policy_version for t in state.turns] or [self._served_version()]
        return CompletionResult(
            prompt_id=prompt.id,
            prompt_token_ids=state.prompt_ids,
            token_ids=state.tokens,
            text=decode_text(self._tokenizer, state.tokens, skip_special_tokens=True),
            logprobs=state.logprobs,
            finish_reason=state.finish,
            policy_version=min(versions),
            tool_mask=state.tool_mask,
            turns=state.turns,
            tool_call_count=state.tool_calls,
            tool_failure_count=state.tool_failures,
            env_reward=state.env_reward,
            error=state.error,
            token_versions=state.token_versions,
        )
