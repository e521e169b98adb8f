"""The gateway's session registry: unguessable ids, expiry, and the bounds on sessions and calls."""

from __future__ import annotations

import pytest

from grpo_runtime.errors import NotFound, ResourceExhausted
from rollout_service.codec import (
    decode_agent_trajectory,
    decode_open_agent_session_request,
    encode_agent_trajectory,
    encode_open_agent_session_request,
)
from rollout_service.gateway.sessions import SessionRegistry
from rollout_service.gateway.types import AgentSequence, AgentTrajectory


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


def test_trajectory_and_ttl_codec_round_trip():
    trajectory = AgentTrajectory(
        [AgentSequence([5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25], [2, 3, 3])], 2, 4, 1
    )
    assert decode_agent_trajectory(encode_agent_trajectory(trajectory)) == trajectory
    assert decode_open_agent_session_request(encode_open_agent_session_request(12.5)) == 12.5
    with pytest.raises(Exception, match="ttl_seconds"):
        decode_open_agent_session_request(encode_open_agent_session_request(-1))
