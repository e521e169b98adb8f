"""The gateway's session registry: unguessable ids, expiry, and the bounds on sessions and calls."""

from __future__ import annotations

import asyncio
from array import array

import pytest

from grpo_runtime.errors import NotFound, ResourceExhausted
from rollout_service.codec import (
    decode_agent_trajectory,
    decode_open_agent_session_request,
    decode_open_agent_sessions_request,
    encode_agent_trajectory,
    encode_open_agent_session_request,
    encode_open_agent_sessions_request,
)
from rollout_service.core.scheduler import BatchScheduler
from rollout_service.gateway.sessions import CallRecord, SampledChoice, SessionRegistry, StoredResponse
from rollout_service.gateway.types import (
    AgentSequence,
    AgentTrajectory,
    FunctionCall,
    Message,
    PinnedSampling,
    Sampling,
)
from rollout_service.types import GenerationJob, SamplingSpec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ids_are_unguessable_and_expire():
    clock = Clock()
    registry = SessionRegistry(max_sessions=10, max_calls_per_session=5, ttl_s=60, clock=clock)
    tickets = [registry.open() for _ in range(3)]
    assert len({t.session_id for t in tickets}) == 3
    assert all(len(t.session_id) >= 32 for t in tickets)  # 24 random bytes, base64url
    assert tickets[0].expires_unix_ms == 1_060_000
    short = registry.open(ttl_s=5)
    assert short.expires_unix_ms == 1_005_000
    assert registry.open(ttl_s=10_000).expires_unix_ms == 1_060_000  # the server's ttl is the ceiling
    clock.now += 6
    with pytest.raises(NotFound):
        registry.get(short.session_id)
    registry.get(tickets[0].session_id)
    with pytest.raises(NotFound):
        registry.get("guess")
    assert registry.close(tickets[0].session_id) and not registry.close(tickets[0].session_id)


def test_sessions_and_calls_are_bounded_with_a_retry_hint():
    clock = Clock()
    registry = SessionRegistry(max_sessions=2, max_calls_per_session=2, ttl_s=30, clock=clock)
    first = registry.open()
    registry.open()
    with pytest.raises(ResourceExhausted) as full:
        registry.open()
    assert full.value.field == "gateway.max_sessions" and full.value.retry_after_s == 30
    session = registry.get(first.session_id)
    session.admit_call(clock.now)
    session.admit_call(clock.now)
    with pytest.raises(ResourceExhausted) as calls:
        session.admit_call(clock.now)
    assert calls.value.field == "gateway.max_calls_per_session" and calls.value.retry_after_s >= 1
    clock.now += 31  # both expire: room again
    registry.open()


def test_sessions_open_together_all_or_none():
    clock = Clock()
    registry = SessionRegistry(max_sessions=4, max_calls_per_session=2, ttl_s=30, clock=clock)
    tickets = registry.open_many(3, ttl_s=5)
    assert len({t.session_id for t in tickets}) == 3 and {t.expires_unix_ms for t in tickets} == {1_005_000}
    with pytest.raises(ResourceExhausted) as full:
        registry.open_many(2)
    assert full.value.field == "gateway.max_sessions" and full.value.retry_after_s == 5
    assert len(registry) == 3  # none of the two was opened
    with pytest.raises(ResourceExhausted) as never:
        registry.open_many(5)
    assert never.value.field == "count" and never.value.retry_after_s is None  # can never fit: no retry hint
    assert registry.open_many(1)


def test_a_dropped_sessions_id_is_released_once_whether_closed_or_expired():
    clock = Clock()
    released: list[str] = []
    registry = SessionRegistry(
        max_sessions=4, max_calls_per_session=2, ttl_s=30, clock=clock, release=released.append
    )
    closed, expiring, open_ = registry.open_many(3)
    session = registry.get(closed.session_id)
    assert registry.close(closed.session_id) and not registry.close(closed.session_id)
    assert session.closed and released == [closed.session_id]
    clock.now += 31
    with pytest.raises(NotFound):
        registry.get(expiring.session_id)
    assert len(registry) == 0  # the other expired one goes with the next use
    assert sorted(released[1:]) == sorted([expiring.session_id, open_.session_id])


def test_trajectory_and_ttl_codec_round_trip():
    trajectory = AgentTrajectory(
        [AgentSequence([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25], [2, 3, 3])], 2, 4, 1
    )
    assert decode_agent_trajectory(encode_agent_trajectory(trajectory)) == trajectory
    unset = (12.5, None, None, None)
    assert decode_open_agent_session_request(encode_open_agent_session_request(12.5)) == unset
    assert decode_open_agent_session_request(encode_open_agent_session_request(0, None, 7))[2] == 7
    many = encode_open_agent_sessions_request(16, 40.0, None, 3, 48)
    assert decode_open_agent_sessions_request(many) == (16, 40.0, None, 3, 48)
    with pytest.raises(Exception, match="ttl_seconds"):
        decode_open_agent_session_request(encode_open_agent_session_request(-1))


def test_recorded_calls_count_against_the_bound_until_their_session_is_dropped():
    registry = SessionRegistry(max_sessions=4, max_calls_per_session=8, ttl_s=60, max_recorded_tokens=20)
    first, second = (registry.get(t.session_id) for t in registry.open_many(2))
    choice = SampledChoice([7, 8], [0.0, 0.0], [0, 0], "", Message("assistant", ""))
    call = CallRecord(0, "chat", [1, 2, 3, 4], [choice], 0, rendered_ids=array("i", [1, 2, 3, 4]))
    assert call.held_tokens == 10  # prompt, rendering, choice
    registry.check_record_room(10)
    registry.record(first, call)
    assert (first.held_tokens, registry.held_tokens) == (10, 10)
    with pytest.raises(ResourceExhausted) as full:
        registry.check_record_room(11)
    assert full.value.field == "gateway.max_recorded_tokens" and full.value.retry_after_s == 1.0
    registry.close(second.session_id)
    registry.record(second, call)  # a call that ended after its session was closed holds nothing
    assert registry.held_tokens == 10
    registry.close(first.session_id)
    assert registry.held_tokens == 0
    registry.check_record_room(20)


def record(session, prompt_ids, sampled, parent=None):
    """A finished call of ``session``: ``prompt_ids`` fed, ``sampled`` ids answered (one choice)."""
    choice = SampledChoice(sampled, [0.0] * len(sampled), [0] * len(sampled), "", Message("assistant", ""))
    session.record(CallRecord(session.next_index, "chat", prompt_ids, [choice], 0, parent=parent))


def test_a_stored_response_is_read_from_its_calls_record_without_its_instructions():
    registry = SessionRegistry(max_sessions=1, max_calls_per_session=4, ttl_s=60)
    session = registry.get(registry.open().session_id)
    system, user = Message("system", "Be brief."), Message("user", "1 + 1?")
    reply = Message("assistant", "2")
    choice = SampledChoice([3], [-0.5], [0], "2", reply)
    session.record(CallRecord(0, "chat", [1, 2], [choice], 0, messages=(system, user)))
    session.responses["resp_a"] = StoredResponse(call=0, first_message=1)
    assert session.stored_conversation("resp_a") == (user, reply)
    with pytest.raises(NotFound) as info:
        session.stored_conversation("resp_b")
    assert info.value.field == "previous_response_id"


def test_a_branchs_completion_budget_is_what_its_calls_added_after_its_roots_prompt():
    registry = SessionRegistry(max_sessions=4, max_calls_per_session=8, ttl_s=60)
    session = registry.get(registry.open(max_completion_tokens=10).session_id)
    prompt = [1, 2, 3]
    assert session.completion_tokens_left(prompt, None) == 10  # a first call: nothing spent
    record(session, prompt, [4, 5, 6])
    second = [*prompt, 4, 5, 6, 90, 91]  # the reply, then a tool result the agent wrote
    assert session.completion_tokens_left(second, (0, 0)) == 5
    record(session, second, [7, 8, 9, 10, 11], parent=(0, 0))
    third = [*second, 7, 8, 9, 10, 11, 92]
    assert session.completion_tokens_left(third, (1, 0)) == -1  # spent
    # A rewritten history starts a branch of its own, with the whole budget.
    assert session.completion_tokens_left([1, 2, 3, 50], None) == 10
    unbounded = registry.get(registry.open().session_id)
    assert unbounded.completion_tokens_left(prompt, None) is None


def test_a_pinned_sampling_round_trips_with_unset_fields_at_their_defaults():
    request = encode_open_agent_session_request(5.0, {"temperature": 0.7, "top_k": 20, "max_tokens": None})
    ttl, pinned, _, _ = decode_open_agent_session_request(request)
    assert ttl == 5.0 and pinned is not None
    assert (pinned.spec.temperature, pinned.spec.top_k, pinned.spec.top_p) == (pytest.approx(0.7), 20, 1.0)
    assert pinned.max_tokens is None  # no cap: each call keeps its own


def test_a_pinned_sampling_replaces_the_calls_distribution_and_caps_its_length():
    pinned = PinnedSampling(SamplingSpec(temperature=0.0, top_p=0.9, top_k=5, min_p=0.1), max_tokens=8)
    asked = Sampling(SamplingSpec(temperature=1.5, top_p=1.0, max_tokens=64, stop=("##",), seed=3), 64)
    applied = pinned.apply(asked)
    spec = applied.spec
    assert (spec.temperature, spec.top_p, spec.top_k, spec.min_p) == (0.0, 0.9, 5, 0.1)
    assert applied.max_tokens == spec.max_tokens == 8
    assert (spec.stop, spec.seed) == (("##",), 3)  # the call's own
    shorter = pinned.apply(Sampling(SamplingSpec(max_tokens=4), 4))
    assert shorter.max_tokens == shorter.spec.max_tokens == 4
    unset = pinned.apply(Sampling(SamplingSpec(max_tokens=1), None))
    assert unset.max_tokens is None  # the gateway gives what the context leaves, within the cap


def recorded_call(index: int, *, tool_calls: bool) -> CallRecord:
    calls = (FunctionCall("call_0", "calculator", '{"expression": "1 + 1"}'),) if tool_calls else ()
    reply = Message("assistant", "" if tool_calls else "2", tool_calls=calls)
    return CallRecord(index, "chat", [1, 2], [SampledChoice([3], [-0.5], [0], reply.content, reply)], 0)


async def test_batches_wait_for_a_session_whose_reply_asked_for_tool_results():
    batches: list[int] = []

    async def run(jobs: list[GenerationJob]) -> None:
        batches.append(len(jobs))

    # A gather of an hour: a batch runs early only when no session is waited for.
    scheduler = BatchScheduler(run, window_s=0.001, gather_s=3600.0)
    scheduler.start()
    registry = SessionRegistry(max_sessions=4, max_calls_per_session=4, ttl_s=60, register=scheduler.caller)
    calling = registry.get(registry.open().session_id)
    answered = registry.get(registry.open().session_id)
    calling.record(recorded_call(0, tool_calls=True))  # its agent runs the tool, then calls again
    answered.record(recorded_call(0, tool_calls=False))  # a final answer: not waited for
    queued = asyncio.create_task(scheduler.submit(GenerationJob([[1]], 1, SamplingSpec())))
    await asyncio.sleep(0.05)
    assert batches == []  # held for the session that will call again
    registry.close(calling.session_id)
    await asyncio.wait_for(queued, 30)
    await scheduler.close()
    assert batches == [1]
