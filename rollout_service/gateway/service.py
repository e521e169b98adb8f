"""The gateway's data plane: one method per endpoint, generating through the same RolloutCore (scheduler,
batches, engine, validation and limits) as ``Generate``.

A call is served outside a session (the current policy, as ``Generate``; off when
``gateway.serve_without_session`` is false) or inside one, where it is admitted against the session's call
bound, its prompt reuses the ids of the call it extends (:mod:`conversation`) and, once generated, it is
recorded (:mod:`sessions`); a failed generation records nothing. A session's calls carry its key to the
engine, which may keep the KV cache of a reply for the session's next call (whose prompt holds the reply's
exact ids), as the episode loop's turns do; the key is released when the session closes or expires.

Tool calls in a chat reply are parsed with the episode loop's parser (``core.tool_calls``: Hermes/Qwen
``<tool_call>{"name", "arguments"}</tool_call>`` blocks) when the request has tools and ``tool_choice`` is
not "none". ``tool_choice`` "none" is enforced (the text is not parsed); "auto", "required" and a named
function parse the same way — the model is not constrained to call, nor to call that function.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from array import array
from typing import Literal

from grpo_runtime.errors import InvalidArgument, NotFound, ResourceExhausted
from grpo_runtime.off_loop import off_loop_unless
from grpo_runtime.tokenizing import decode_text
from rollout_service.core.rollout import INLINE_TOKENS, RolloutCore
from rollout_service.core.tool_calls import TOOL_CALL, parse_tool_calls
from rollout_service.core.validation import MAX_CHARS_PER_TOKEN, validate_sampling
from rollout_service.core.versioning import check_min_version
from rollout_service.gateway.conversation import ConversationRenderer, PromptPlan, tools_key
from rollout_service.gateway.sessions import (
    CallRecord,
    SampledChoice,
    Session,
    SessionRegistry,
    StoredResponse,
)
from rollout_service.gateway.trajectory import trajectory
from rollout_service.gateway.types import (
    AgentTrajectory,
    Answer,
    ChatRequest,
    Choice,
    CompletionRequest,
    FunctionCall,
    Message,
    PinnedSampling,
    ResponsesRequest,
    Sampling,
    SessionTicket,
)
from rollout_service.settings import GatewaySettings
from rollout_service.types import CompletionResult, FinishReason, GenerateRequest, PromptInput


def engine_session(session_id: str) -> str:
    """The engine's key for a gateway session's KV cache (apart from the episode loop's keys)."""
    return f"gateway/{session_id}"


class AgentGateway:
    """``model_name``: the id ``/v1/models`` lists and every answer carries (requests may name any model:
    there is one policy)."""

    def __init__(
        self, core: RolloutCore, settings: GatewaySettings, model_name: str, clock=time.time
    ) -> None:
        self._core = core
        self.settings = settings
        self.model_name = model_name
        self._clock = clock
        self.sessions = SessionRegistry(
            max_sessions=settings.max_sessions,
            max_calls_per_session=settings.max_calls_per_session,
            ttl_s=settings.session_ttl_s,
            max_recorded_tokens=settings.max_recorded_tokens,
            clock=clock,
            register=core.register_caller,
            release=lambda session_id: core.release_session(engine_session(session_id)),
        )
        self._renderer = ConversationRenderer(core.tokenizer)
        self.started = int(clock())  # the model's "created" in /v1/models
        self.port: int | None = None  # the HTTP port once its endpoint is bound (GetStatus reports it)

    # ------------------------------------------------------------- sessions
    def open_session(
        self,
        ttl_s: float = 0.0,
        sampling: PinnedSampling | None = None,
        min_policy_version: int | None = None,
        max_completion_tokens: int | None = None,
    ) -> SessionTicket:
        """A session of ``ttl_s`` seconds (0: the server's); ``sampling``: the distribution its calls
        sample from whatever they ask (a call's length stays within the gateway's ``max_tokens`` too);
        ``min_policy_version``: its calls generate once that version serves; ``max_completion_tokens``: the
        tokens a branch's completion may hold (each call capped at what is left)."""
        return self.open_sessions(1, ttl_s, sampling, min_policy_version, max_completion_tokens)[0]

    def open_sessions(
        self,
        count: int,
        ttl_s: float = 0.0,
        sampling: PinnedSampling | None = None,
        min_policy_version: int | None = None,
        max_completion_tokens: int | None = None,
    ) -> list[SessionTicket]:
        """``count`` sessions as :meth:`open_session` opens one, all or none (a trainer opens a step's
        sessions together)."""
        if count < 1:
            raise InvalidArgument(f"must be at least 1, got {count}", field="count")
        if sampling is not None:
            sampling = PinnedSampling(validate_sampling(sampling.spec), sampling.max_tokens)
        check_min_version(min_policy_version)
        if max_completion_tokens is not None and max_completion_tokens < 1:
            raise InvalidArgument(
                f"must be at least 1 when set, got {max_completion_tokens}", field="max_completion_tokens"
            )
        tickets = self.sessions.open_many(count, ttl_s, sampling, min_policy_version, max_completion_tokens)
        return [dataclasses.replace(ticket, openai_port=self.port or 0) for ticket in tickets]

    async def trajectory(self, session_id: str, *, close: bool = False) -> AgentTrajectory:
        """The session's calls as sequences (``close``: then closed). Built from a copy of its record taken
        now, so a call that ends meanwhile changes nothing; a session holding more than ``INLINE_TOKENS``
        token ids is laid out in a worker thread, never holding the event loop."""
        session = self.sessions.get(session_id)
        record = dataclasses.replace(session, calls=list(session.calls))
        if close:
            self.sessions.close(session_id)
        return await off_loop_unless(record.held_tokens <= INLINE_TOKENS, trajectory, record)

    def close_session(self, session_id: str) -> bool:
        return self.sessions.close(session_id)

    def check_session(self, session_id: str | None) -> None:
        """NotFound for an unknown or expired session, or for no session when only sessions are served."""
        self._admit(session_id, count=False)

    @property
    def max_model_len(self) -> int:
        return self._core.validator.max_model_len

    # ------------------------------------------------------------ endpoints
    async def chat(self, request: ChatRequest, session_id: str | None, *, small: bool = False) -> Answer:
        """``small``: the request is small enough (the HTTP layer checked its body's size) to render its
        prompt on the event loop; otherwise that runs in a worker thread."""
        session = self._admit(session_id)
        calls = list(session.calls) if session is not None else []
        render = self._renderer.chat_prompt
        plan = await off_loop_unless(small, render, calls, request.messages, request.tools)
        logprobs = request.top_logprobs is not None
        left = self._budget_left(session, plan)
        if session is not None and left is not None and left < 1:
            return self._spent(session, "chat", plan.prompt_ids, request.n, logprobs)
        self._check_record_room(session, plan)
        results = await self._generate(plan.prompt_ids, request.n, request.sampling, session, left)
        parse = bool(request.tools) and request.tool_choice != "none"
        choices = [self._choice(i, r, logprobs, self._reply(r.text, parse)) for i, r in enumerate(results)]
        index = None
        if session is not None:
            key = tools_key(request.tools)
            index = self._record(session, "chat", plan, results, choices, request.messages, key)
        return self._answer("chat", plan.prompt_ids, choices, index)

    async def respond(
        self, request: ResponsesRequest, session_id: str | None, *, small: bool = False
    ) -> Answer:
        """A Responses API call served as the chat call it means, after ``previous_response_id``'s stored
        conversation when given (:meth:`_continued`), and kept under the answer's ``resp_`` id unless
        ``store`` is false. Responses are kept in the session that made them, and only there, as a
        reference to the call's record: one answered empty for a spent budget (nothing generated or
        recorded) is not kept."""
        session = self._admit(session_id, count=False)
        chat = request.chat
        if request.previous_response_id is not None:
            chat = self._continued(request, session)
            small = False  # a short body may continue a long conversation: render in a worker thread
        answer = await self.chat(chat, session_id, small=small)
        answer = dataclasses.replace(answer, id=f"resp_{answer.id.removeprefix('chatcmpl-')}")
        if session is not None and request.store and answer.call_index is not None:
            # Instructions are not carried over: the stored conversation starts after them.
            session.responses[answer.id] = StoredResponse(answer.call_index, request.instruction_messages)
        return answer

    def _continued(self, request: ResponsesRequest, session: Session | None) -> ChatRequest:
        """The chat request of a call continuing a stored response: the request's own instructions (a
        previous response's are not carried over, as in OpenAI's API), the stored conversation, the input;
        refused past ``gateway.max_messages``."""
        if session is None:
            raise InvalidArgument(
                "responses are stored only within a session (/sessions/<id>/v1); send the whole "
                "conversation as input",
                field="previous_response_id",
            )
        assert request.previous_response_id is not None
        earlier = session.stored_conversation(request.previous_response_id)
        head = request.chat.messages[: request.instruction_messages]
        messages = head + earlier + request.input_messages
        if len(messages) > self.settings.max_messages:
            raise ResourceExhausted(
                f"{len(messages)} messages with those of previous_response_id, more than the server's "
                f"limit gateway.max_messages = {self.settings.max_messages}",
                field="input",
            )
        return dataclasses.replace(request.chat, messages=messages)

    async def complete(
        self, request: CompletionRequest, session_id: str | None, *, small: bool = False
    ) -> Answer:
        """``small``: as for :meth:`chat`."""
        session = self._admit(session_id)
        if isinstance(request.prompt, str) and len(request.prompt) > self.max_model_len * MAX_CHARS_PER_TOKEN:
            raise InvalidArgument(
                f"{len(request.prompt)} characters cannot fit the model's context of {self.max_model_len} "
                "tokens",
                field="prompt",
            )
        calls = list(session.calls) if session is not None else []
        plan = await off_loop_unless(small, self._renderer.completion_prompt, calls, request.prompt)
        logprobs = request.logprobs is not None
        left = self._budget_left(session, plan)
        if session is not None and left is not None and left < 1:
            return self._spent(session, "completion", plan.prompt_ids, request.n, logprobs)
        self._check_record_room(session, plan)
        results = await self._generate(plan.prompt_ids, request.n, request.sampling, session, left)
        choices = [self._choice(i, r, logprobs) for i, r in enumerate(results)]
        index = None
        if session is not None:
            text = request.prompt if isinstance(request.prompt, str) else ""
            index = self._record(session, "completion", plan, results, choices, prompt_text=text)
        return self._answer("completion", plan.prompt_ids, choices, index)

    # --------------------------------------------------------------- helpers
    def _admit(self, session_id: str | None, *, count: bool = True) -> Session | None:
        """The call's session (None outside one), its call counted (``count``)."""
        if session_id is None:
            if not self.settings.serve_without_session:
                raise NotFound(
                    "this gateway serves sessions only (gateway.serve_without_session is off): use "
                    "/sessions/<id>/v1",
                    field="session_id",
                )
            return None
        session = self.sessions.get(session_id)
        if count:
            session.admit_call(self._clock())
        return session

    async def _generate(
        self,
        prompt_ids: list[int],
        n: int,
        sampling: Sampling,
        session: Session | None,
        budget_left: int | None = None,
    ) -> list[CompletionResult]:
        """``budget_left``: what is left of the session's completion budget, a cap on this call."""
        ceiling = self.settings.max_tokens
        if session is not None and session.sampling is not None:
            sampling = session.sampling.apply(sampling)
            ceiling = min(ceiling, session.sampling.max_tokens or ceiling)
        if budget_left is not None:
            ceiling = min(ceiling, budget_left)
        spec = sampling.spec
        if sampling.max_tokens is None:  # what the context leaves, within the bound
            room = self.max_model_len - len(prompt_ids)
            spec = dataclasses.replace(spec, max_tokens=max(1, min(ceiling, room)))
        elif sampling.max_tokens > ceiling:  # the call's own max_tokens is within the others already
            spec = dataclasses.replace(spec, max_tokens=ceiling)
        if budget_left is not None and spec.min_tokens > spec.max_tokens:
            # The agent cannot know what is left of the budget: a min_tokens it asked for yields to it.
            spec = dataclasses.replace(spec, min_tokens=spec.max_tokens)
        prompt = PromptInput(token_ids=tuple(prompt_ids))
        min_version = session.min_policy_version if session is not None else None
        request = GenerateRequest((prompt,), n, spec, min_policy_version=min_version)
        if session is None:
            return await self._core.generate(request)
        key = engine_session(session.session_id)
        try:
            return await self._core.generate(request, session.caller, key)
        finally:
            if session.closed:  # while the call ran: what the engine kept after the release goes too
                self._core.release_session(key)

    def _check_record_room(self, session: Session | None, plan: PromptPlan) -> None:
        """A session's call that would generate (and be recorded) is refused first when its record would not
        fit; one answered empty for a spent budget records nothing, so it needs no room."""
        if session is not None:
            self.sessions.check_record_room(len(plan.prompt_ids) + len(plan.rendered))

    @staticmethod
    def _budget_left(session: Session | None, plan: PromptPlan) -> int | None:
        """What is left of the call's branch's completion budget (None: no session, or no budget)."""
        return session.completion_tokens_left(plan.prompt_ids, plan.parent) if session is not None else None

    def _spent(
        self,
        session: Session,
        kind: Literal["chat", "completion"],
        prompt_ids: list[int],
        n: int,
        logprobs: bool,
    ) -> Answer:
        """The answer to a call made when its branch's completion budget is spent: ``n`` empty choices that
        finished with length (empty logprobs where asked for), nothing generated or recorded; its agent is
        not waited for."""
        if session.caller is not None:
            session.caller.idle()
        message = Message("assistant", "") if kind == "chat" else None
        tokens: list[str] | None = [] if logprobs else None
        empty = [Choice(i, [], [], [], "", FinishReason.LENGTH, message, tokens) for i in range(n)]
        return self._answer(kind, prompt_ids, empty)

    def _choice(
        self, index: int, result: CompletionResult, logprobs: bool, message: Message | None = None
    ) -> Choice:
        """``logprobs``: decode each sampled id alone, for OpenAI's logprobs."""
        decoded = [decode_text(self._core.tokenizer, [t]) for t in result.token_ids] if logprobs else None
        return Choice(
            index,
            result.token_ids,
            result.logprobs,
            result.token_versions,
            result.text,
            result.finish_reason,
            message,
            decoded,
        )

    @staticmethod
    def _reply(text: str, parse: bool) -> Message:
        """The assistant message of a reply: its tool calls (``parse``) as OpenAI calls, and the text around
        them; a block that is not a call stays in the text."""
        if not parse:
            return Message("assistant", text)
        parsed = parse_tool_calls(text)
        calls = [
            FunctionCall(f"call_{uuid.uuid4().hex[:24]}", p.call.name, p.call.arguments_json)
            for p in parsed
            if not p.error
        ]
        if not calls:
            return Message("assistant", text)
        valid = iter([not p.error for p in parsed])
        content = TOOL_CALL.sub(lambda m: "" if next(valid) else m.group(0), text)
        return Message("assistant", re.sub(r"\n{3,}", "\n\n", content).strip(), tuple(calls))

    def _record(
        self,
        session: Session,
        kind: Literal["chat", "completion"],
        plan: PromptPlan,
        results: list[CompletionResult],
        choices: list[Choice],
        messages: tuple[Message, ...] = (),
        key: str = "",
        prompt_text: str = "",
    ) -> int:
        """Record a generated call; its index in the session's calls."""
        session.retokenized_tokens += plan.retokenized
        session.prefix_mismatches += plan.mismatch
        index = session.next_index
        self.sessions.record(
            session,
            CallRecord(
                index=index,
                kind=kind,
                prompt_ids=plan.prompt_ids,
                choices=[
                    SampledChoice(c.token_ids, c.logprobs, c.token_versions, c.text, c.message)
                    for c in choices
                ],
                policy_version=min((r.policy_version for r in results), default=0),
                parent=plan.parent,
                reused=plan.reused,
                messages=messages,
                tools_key=key,
                rendered_ids=array("i", plan.rendered),
                prompt_text=prompt_text,
            ),
        )
        return index

    def _answer(
        self,
        kind: Literal["chat", "completion"],
        prompt_ids: list[int],
        choices: list[Choice],
        call_index: int | None = None,
    ) -> Answer:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        answer_id = f"{prefix}-{uuid.uuid4().hex}"
        return Answer(answer_id, kind, int(self._clock()), self.model_name, prompt_ids, choices, call_index)
