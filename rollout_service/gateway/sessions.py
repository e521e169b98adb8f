"""Sessions of the gateway: unguessable ids that expire, and the record of every model call made in one.

A session id is ``secrets.token_urlsafe(24)`` (192 random bits): holding it is the capability to call the
policy under ``/sessions/<id>/v1`` and to have the calls recorded. The registry is bounded (``max_sessions``
open at once, ``max_calls_per_session`` calls each, ``max_recorded_tokens`` token ids held by the recorded
calls of all of them: each call keeps its whole prompt, so memory grows with calls × context); the refusals
are ResourceExhausted with a retry hint, which the gateway answers as 429 with ``Retry-After``. An unknown or
expired id is NotFound (404). Expired sessions are dropped when the registry is next used; ``release`` is
told each dropped session's id (the gateway frees the KV cache the engine kept for it).

A session also keeps the Responses API responses its calls made (``previous_response_id``), each a
reference to the record of the call that made it (:class:`StoredResponse`): the conversation through its
reply is read from that record, so keeping one costs no more memory whatever its length.

Each open session is a registered caller of the batch scheduler (``register``, ``scheduler.Caller``). Before
its first call, and after a reply that asked for tool results, its agent is about to call again (it runs the
tools meanwhile): the batch being formed waits for it up to the scheduler's ``gather_s``, so the calls of
agents that move in step share a batch. After any other reply (a final answer, a completion) it is not
waited for until it calls again.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from grpo_runtime.errors import NotFound, ResourceExhausted
from rollout_service.core.scheduler import Caller
from rollout_service.gateway.types import Message, PinnedSampling, SessionTicket

SESSION_ID_BYTES = 24


@dataclass(frozen=True)
class SampledChoice:
    """One of a call's samples: the ids the engine produced, their logprobs and versions, and what the agent
    was answered (the reply message of a chat call, the text of a completion)."""

    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    text: str
    reply: Message | None = None


@dataclass(frozen=True)
class CallRecord:
    """One model call: ``prompt_ids`` exactly as fed to the engine. ``parent`` (call index, choice) when the
    prompt extends that call's prompt + sampled ids (its first ``reused`` ids are those), else None (the
    root of a branch). ``policy_version``: the version serving the call (that of the ids it added).
    ``messages`` / ``tools_key`` (chat) or ``prompt_text`` (completion) are what the agent sent, to match a
    later call against; ``rendered_ids`` (chat) the template's ids of ``messages`` (with the generation
    prompt), which may differ from ``prompt_ids`` where those reuse sampled ids (the gateway keeps them as an
    ``array`` of 4-byte ints: every call keeps its whole rendering)."""

    index: int
    kind: Literal["chat", "completion"]
    prompt_ids: list[int]
    choices: list[SampledChoice]
    policy_version: int
    parent: tuple[int, int] | None = None
    reused: int = 0
    messages: tuple[Message, ...] = ()
    tools_key: str = ""
    rendered_ids: Sequence[int] = ()
    prompt_text: str = ""

    @property
    def held_tokens(self) -> int:
        """Token ids the record holds: its prompt, its rendering and its choices."""
        return len(self.prompt_ids) + len(self.rendered_ids) + sum(len(c.token_ids) for c in self.choices)


@dataclass(frozen=True)
class StoredResponse:
    """A Responses API response kept for ``previous_response_id``: the index of the call record that made
    it, and the first of that call's messages its conversation keeps (1 past the system message of the
    call's ``instructions``, which are not carried over)."""

    call: int
    first_message: int


@dataclass
class Session:
    """One session: its calls in the order they finished, and the divergence counters."""

    session_id: str
    expires_at: float  # wall-clock seconds
    max_calls: int
    sampling: PinnedSampling | None = None  # imposed on every call; None: each call's own
    min_policy_version: int | None = None  # every call generates once this version serves
    max_completion_tokens: int | None = None  # a branch's completion budget; None: none
    calls: list[CallRecord] = field(default_factory=list)
    started: int = 0  # calls admitted (finished, failed or in flight)
    retokenized_tokens: int = 0
    prefix_mismatches: int = 0
    held_tokens: int = 0  # of its recorded calls (CallRecord.held_tokens)
    caller: Caller | None = field(default=None, repr=False)  # its handle with the batch scheduler
    closed: bool = False  # closed or expired, and dropped from the registry
    responses: dict[str, StoredResponse] = field(default_factory=dict, repr=False)  # by response id

    def admit_call(self, now: float) -> None:
        """Count one more call; ResourceExhausted past ``max_calls``."""
        if self.started >= self.max_calls:
            raise ResourceExhausted(
                f"the session made {self.started} calls, the server's limit gateway.max_calls_per_session "
                f"is {self.max_calls}",
                field="gateway.max_calls_per_session",
                retry_after_s=max(1.0, self.expires_at - now),
            )
        self.started += 1

    def record(self, call: CallRecord) -> None:
        """Add a finished call; unless one of its replies has tool calls, stop the batches waiting for the
        session's next call."""
        self.calls.append(call)
        replies = (choice.reply for choice in call.choices)
        if self.caller is not None and not any(reply is not None and reply.tool_calls for reply in replies):
            self.caller.idle()

    def stored_conversation(self, response_id: str) -> tuple[Message, ...]:
        """The conversation a stored response closes (earlier messages, its input, its reply), read from its
        call's record; NotFound for one this session did not store."""
        stored = self.responses.get(response_id)
        if stored is None:
            raise NotFound(
                f"no response {response_id!r:.60} is stored in this session (stored only with store "
                "true, in the session that made it)",
                field="previous_response_id",
            )
        call = self.calls[stored.call]
        reply = call.choices[0].reply
        assert reply is not None  # a chat call's
        return (*call.messages[stored.first_message :], reply)

    @property
    def next_index(self) -> int:
        return len(self.calls)

    def completion_tokens_left(self, prompt_ids: list[int], parent: tuple[int, int] | None) -> int | None:
        """What is left of ``max_completion_tokens`` for a call whose prompt is ``prompt_ids``, extending
        the call and choice ``parent`` (None: it starts a branch, so nothing is spent): the branch's
        completion starts after its root call's prompt. None without a budget."""
        if self.max_completion_tokens is None:
            return None
        if parent is None:
            return self.max_completion_tokens
        root = self.calls[parent[0]]
        while root.parent is not None:
            root = self.calls[root.parent[0]]
        return self.max_completion_tokens - (len(prompt_ids) - len(root.prompt_ids))


class SessionRegistry:
    """Open sessions by id. ``clock``: wall-clock seconds (injectable for tests)."""

    def __init__(
        self,
        *,
        max_sessions: int,
        max_calls_per_session: int,
        ttl_s: float,
        max_recorded_tokens: int = 1 << 26,
        clock: Callable[[], float] = time.time,
        register: Callable[[], Caller] | None = None,
        release: Callable[[str], None] | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_calls_per_session = max_calls_per_session
        self.max_recorded_tokens = max_recorded_tokens
        self.held_tokens = 0  # by the recorded calls of the open sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._register = register
        self._release = release
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        self._drop_expired()
        return len(self._sessions)

    @property
    def open_count(self) -> int:
        """Sessions in the registry, expired ones included until it is next used (a read that changes
        nothing, for another thread)."""
        return len(self._sessions)

    def open(
        self,
        ttl_s: float = 0.0,
        sampling: PinnedSampling | None = None,
        min_policy_version: int | None = None,
        max_completion_tokens: int | None = None,
    ) -> SessionTicket:
        """A new session living ``ttl_s`` seconds (0 or more than the server's ``ttl_s``: that), whose calls
        sample with ``sampling`` when given, generate once ``min_policy_version`` serves and keep each
        branch's completion within ``max_completion_tokens``."""
        return self.open_many(1, ttl_s, sampling, min_policy_version, max_completion_tokens)[0]

    def open_many(
        self,
        count: int,
        ttl_s: float = 0.0,
        sampling: PinnedSampling | None = None,
        min_policy_version: int | None = None,
        max_completion_tokens: int | None = None,
    ) -> list[SessionTicket]:
        """``count`` sessions as :meth:`open` opens one, all or none."""
        now = self._clock()
        self._drop_expired()
        self._check_room(count, now)
        lifetime = self.ttl_s if not 0 < ttl_s <= self.ttl_s else ttl_s
        tickets = []
        for _ in range(count):
            session = Session(
                secrets.token_urlsafe(SESSION_ID_BYTES),
                now + lifetime,
                self.max_calls_per_session,
                sampling,
                min_policy_version,
                max_completion_tokens,
            )
            session.caller = self._register() if self._register is not None else None
            self._sessions[session.session_id] = session
            tickets.append(SessionTicket(session.session_id, math.floor(session.expires_at * 1000)))
        return tickets

    def _check_room(self, count: int, now: float) -> None:
        """ResourceExhausted unless ``count`` more sessions fit ``max_sessions``; ``retry_after_s`` (the
        soonest expiry) only when they would fit once sessions expire."""
        if len(self._sessions) + count <= self.max_sessions:
            return
        message = (
            f"{len(self._sessions)} sessions are open, the server's limit gateway.max_sessions is "
            f"{self.max_sessions}"
        )
        if count > self.max_sessions:
            raise ResourceExhausted(f"{count} sessions asked for; {message}", field="count")
        soonest = min(s.expires_at for s in self._sessions.values())
        raise ResourceExhausted(
            f"{message}; close finished ones",
            field="gateway.max_sessions",
            retry_after_s=max(1.0, soonest - now),
        )

    def check_record_room(self, tokens: int) -> None:
        """ResourceExhausted when a call whose prompt and rendering hold ``tokens`` ids would pass
        ``max_recorded_tokens`` (checked before it generates; its choices are not known yet)."""
        if self.held_tokens + tokens <= self.max_recorded_tokens:
            return
        raise ResourceExhausted(
            f"the open sessions' recorded calls hold {self.held_tokens} token ids and this call "
            f"{tokens} more, the server's limit gateway.max_recorded_tokens is {self.max_recorded_tokens}; "
            "read and close finished sessions",
            field="gateway.max_recorded_tokens",
            retry_after_s=1.0,
        )

    def record(self, session: Session, call: CallRecord) -> None:
        """Add a finished call to ``session``; its ids count against ``max_recorded_tokens`` until the
        session is dropped (not when it was dropped while the call ran)."""
        session.record(call)
        if not session.closed:
            session.held_tokens += call.held_tokens
            self.held_tokens += call.held_tokens

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.expires_at <= self._clock():
            self._drop(session_id)
            raise NotFound("no such session (unknown, closed or expired)", field="session_id")
        return session

    def close(self, session_id: str) -> bool:
        session = self._drop(session_id)
        return session is not None and session.expires_at > self._clock()

    def _drop(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        session.closed = True
        self.held_tokens -= session.held_tokens
        if session.caller is not None:
            session.caller.close()
        if self._release is not None:
            self._release(session_id)
        return session

    def _drop_expired(self) -> None:
        now = self._clock()
        for session_id in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            self._drop(session_id)
