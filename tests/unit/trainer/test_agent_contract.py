"""grpo.agent.v1: the codec both ways, and the serving helper on a real in-process server dialled by the
AgentClient — a finished episode, and each way an episode fails (the agent raises, hangs past its deadline,
reports a NaN reward) coming back as its status with the reason."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from grpo.agent.v1 import agent_pb2

from grpo_runtime import agent_codec
from grpo_runtime.agent_client import AgentClient, EpisodeReport, EpisodeTask
from grpo_runtime.agent_server import serve_agent
from grpo_runtime.call_errors import DeadlineExceededError, InternalError, InvalidArgumentError
from grpo_runtime.errors import InvalidArgument

TASK = EpisodeTask(
    task={"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"},
    base_url="http://127.0.0.1:8000/sessions/abc/v1",
    deadline_unix_ms=1_700_000_000_000,
    episode_id="step0-row1-sample0-try0",
)


def test_a_request_and_a_response_map_both_ways():
    assert agent_codec.decode_run_episode_request(agent_codec.encode_run_episode_request(TASK)) == TASK
    report = EpisodeReport(reward=0.5, metadata={"answer": "4", "calls": [1.0, 2.0]})
    assert agent_codec.decode_run_episode_response(agent_codec.encode_run_episode_response(report)) == report
    unjudged = agent_codec.encode_run_episode_response(EpisodeReport())
    assert not unjudged.HasField("reward")
    assert agent_codec.decode_run_episode_response(unjudged) == EpisodeReport()


def test_bad_requests_and_reports_name_their_field():
    with pytest.raises(InvalidArgument) as missing:
        agent_codec.decode_run_episode_request(agent_pb2.RunEpisodeRequest())
    assert missing.value.field == "base_url"
    with pytest.raises(InvalidArgument) as past:
        agent_codec.decode_run_episode_request(agent_pb2.RunEpisodeRequest(base_url="x", deadline_unix_ms=-1))
    assert past.value.field == "deadline_unix_ms"
    with pytest.raises(InvalidArgument) as nan:
        agent_codec.encode_run_episode_response(EpisodeReport(reward=math.nan))
    assert nan.value.field == "reward"
    # A report sent by another language's server is read as sent; the trainer judges the NaN.
    raw = agent_pb2.RunEpisodeResponse(reward=math.nan)
    assert math.isnan(agent_codec.decode_run_episode_response(raw).reward)


async def _agent(task, base_url, deadline):
    question = task["prompt"][0]["content"]
    if question == "raise":
        raise RuntimeError("the tool loop broke")
    if question == "hang":
        await asyncio.sleep(60)
    if question == "nan":
        return math.nan, {}
    return 1.0, {"base_url": base_url, "deadline": deadline, "answer": task["answer"]}


def _task(question: str, seconds: float = 30.0) -> EpisodeTask:
    deadline_ms = int((time.time() + seconds) * 1000)
    row = {"prompt": [{"role": "user", "content": question}], "answer": "4"}
    return EpisodeTask(task=row, base_url="http://gateway/sessions/s/v1", deadline_unix_ms=deadline_ms)


async def test_the_helper_serves_episodes_and_reports_each_failure_with_its_reason():
    server, port = await serve_agent(_agent)
    try:
        async with AgentClient(f"127.0.0.1:{port}") as agent:
            played = _task("2+2?")
            report = await agent.run_episode(played, timeout_s=10)
            assert report.reward == 1.0
            assert report.metadata["base_url"] == played.base_url
            assert report.metadata["deadline"] == pytest.approx(played.deadline_unix_ms / 1000)
            with pytest.raises(InternalError, match="RuntimeError: the tool loop broke"):
                await agent.run_episode(_task("raise"), timeout_s=10)
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                await agent.run_episode(_task("hang", seconds=0.3), timeout_s=10)
            assert time.monotonic() - started < 5
            with pytest.raises(InvalidArgumentError) as nan:
                await agent.run_episode(_task("nan"), timeout_s=10)
            assert nan.value.field == "reward"
    finally:
        await server.stop(0)
