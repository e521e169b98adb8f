"""What a request may cost the reward service, on a real server: requests at each limit are served while
health checks keep being answered (ordering: health answers arrive before the big request's), and
requests just over a limit are refused naming the field, checked on counts before any item is read.

Every gRPC input path (Score, ScoreStream, StressReward, OpenEpisode, Step) and the HTTP /get_reward
endpoint, plus the HTTP connection timeouts.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import requests
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.env.v1 import env_pb2, env_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import create_sync_channel
from grpo_runtime.server import GrpcServer
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.support.statuses import failure

MAX_SAMPLES = 4
MAX_CALLS = 4
# Characters of metadata as json_chars counts them; a list of N nulls in {"x": [...]} is N + 3.
METADATA_CHARS = 150_000
EPISODE_METADATA_CHARS = 400_000
ARGUMENTS_CHARS = 100_000
COST_SETTINGS = {
    **SETTINGS,
    "max_samples": MAX_SAMPLES,
    "max_rewards": 4,
    "max_metadata_chars": METADATA_CHARS,
    "max_prompt_chars": 1000,
    "http": {
        "port": 0,
        "rewards": [{"name": "format", "params": {"style": "r1"}}],
        "max_body_bytes": 16 * 1024 * 1024,
        "header_timeout_s": 1,
        "body_timeout_s": 1,
    },
    "environments": {
        "max_calls_per_step": MAX_CALLS,
        "max_arguments_chars": ARGUMENTS_CHARS,
        "max_metadata_chars": EPISODE_METADATA_CHARS,
        "python": {"enabled": False},
    },
}
# Health answers a request at a limit must let through before it completes; the old code let none.
ANSWERED_MEANWHILE = 3


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with reward_server_thread(COST_SETTINGS) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server) -> Iterator[grpc.Channel]:
    with create_sync_channel(server.address) as channel:
        yield channel


@pytest.fixture(scope="module")
def url(server) -> str:
    [endpoint] = server.companions
    return f"http://127.0.0.1:{endpoint.port}"


def nulls(chars: int, tail: struct_pb2.Value | None = None) -> struct_pb2.Struct:
    """``{"x": [null, ...]}`` of ``chars`` characters, ``tail`` appended past them."""
    struct = struct_pb2.Struct()
    values = struct.fields["x"].list_value.values
    for _ in range(chars - 3):
        values.add().null_value = struct_pb2.NULL_VALUE
    if tail is not None:
        values.add().CopyFrom(tail)
    return struct


NAN = struct_pb2.Value(number_value=float("nan"))


def score_request(samples: int, metadata: struct_pb2.Struct | None = None) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest(rewards=[reward_pb2.RewardSpec(name="tag_count")])
    for i in range(samples):
        sample = request.samples.add(id=str(i), completion="<think>\nx\n</think>")
        if metadata is not None:
            sample.metadata.CopyFrom(metadata)
    return request


def served_meanwhile(
    server: GrpcServer, gauge: tuple[str, dict[str, str]], call: Callable[[], Any], health: Callable[[], None]
) -> tuple[Future, int]:
    """Runs ``call`` on a thread; once the server is handling it (its in-flight ``gauge``), checks health
    until it completes. Returns its future and how many health answers arrived before it completed."""
    registry = server.metrics.registry
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(call)
        deadline = time.monotonic() + 120
        while not registry.get_sample_value(*gauge):
            assert not future.done(), "the request completed before the server was seen handling it"
            assert time.monotonic() < deadline, "the server never started handling the request"
            time.sleep(0.002)
        answered = 0
        while not future.done():
            health()
            answered += not future.done()
        return future, answered


def rpc_gauge(service: str, method: str) -> tuple[str, dict[str, str]]:
    return "grpo_rpc_in_flight", {"service": service, "method": method}


def grpc_health(channel: grpc.Channel) -> Callable[[], None]:
    stub = health_pb2_grpc.HealthStub(channel)

    def check() -> None:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    return check


# --- Score, ScoreStream, StressReward ---------------------------------------------------------------


def test_score_at_the_limits_is_served_while_health_answers(server, channel):
    request = score_request(MAX_SAMPLES, nulls(METADATA_CHARS))
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    future, answered = served_meanwhile(
        server,
        rpc_gauge("grpo.reward.v1.RewardService", "Score"),
        lambda: stub.Score(request, timeout=120),
        grpc_health(channel),
    )
    reply = future.result()
    assert [s.id for s in reply.scores] == ["0", "1", "2", "3"]
    assert all(s.components[0].HasField("value") for s in reply.scores)
    assert answered >= ANSWERED_MEANWHILE


@pytest.mark.slow
def test_score_stream_at_the_limits_is_served_while_health_answers(server, channel):
    big = score_request(MAX_SAMPLES, nulls(METADATA_CHARS))
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    future, answered = served_meanwhile(
        server,
        rpc_gauge("grpo.reward.v1.RewardService", "ScoreStream"),
        lambda: list(stub.ScoreStream(iter([big, big]), timeout=120)),
        grpc_health(channel),
    )
    assert [len(reply.scores) for reply in future.result()] == [MAX_SAMPLES, MAX_SAMPLES]
    assert answered >= ANSWERED_MEANWHILE


def test_metadata_just_over_the_limit_is_refused_before_the_rest_is_read(channel):
    request = score_request(MAX_SAMPLES)
    request.samples[2].metadata.CopyFrom(nulls(METADATA_CHARS + 1, tail=NAN))
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    code, details = failure(lambda: stub.Score(request, timeout=60))
    # The NaN past the limit is never reached: the size is the error.
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"samples[2].metadata: more than max_metadata_chars={METADATA_CHARS}")


@pytest.mark.parametrize("method", ["Score", "ScoreStream", "StressReward"])
def test_counts_just_over_the_limits_are_refused_before_any_sample_is_read(channel, method):
    # Each sample holds a NaN: converting any of them would be INVALID_ARGUMENT instead.
    bad = struct_pb2.Struct()
    bad.fields["x"].number_value = float("nan")
    too_many = score_request(MAX_SAMPLES + 1, bad)
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    calls = {
        "Score": lambda: stub.Score(too_many, timeout=60),
        "ScoreStream": lambda: list(stub.ScoreStream(iter([too_many]), timeout=60)),
        "StressReward": lambda: stub.StressReward(
            reward_pb2.StressRewardRequest(samples=[too_many.samples[0]] * 17, rewards=too_many.rewards),
            timeout=60,
        ),
    }
    code, details = failure(calls[method])
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    limit = "stress_max_samples=16" if method == "StressReward" else f"max_samples={MAX_SAMPLES}"
    assert details.startswith("samples: ") and limit in details
    rewards = score_request(1, bad)
    rewards.rewards.extend([reward_pb2.RewardSpec(name=f"r{i}") for i in range(4)])
    code, details = failure(lambda: stub.Score(rewards, timeout=60))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith("rewards: 5 rewards")


# --- EnvironmentService ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env_stub(channel) -> env_pb2_grpc.EnvironmentServiceStub:
    return env_pb2_grpc.EnvironmentServiceStub(channel)


def test_open_episode_with_metadata_at_the_limit_is_served_while_health_answers(server, channel, env_stub):
    request = env_pb2.OpenEpisodeRequest(environment="calculator", metadata=nulls(EPISODE_METADATA_CHARS))
    future, answered = served_meanwhile(
        server,
        rpc_gauge("grpo.env.v1.EnvironmentService", "OpenEpisode"),
        lambda: env_stub.OpenEpisode(request, timeout=120),
        grpc_health(channel),
    )
    episode = future.result()
    assert episode.episode_id and answered >= ANSWERED_MEANWHILE
    env_stub.CloseEpisode(env_pb2.CloseEpisodeRequest(episode_id=episode.episode_id), timeout=30)


def test_open_episode_just_over_the_limits_is_refused_naming_the_field(env_stub):
    over = env_pb2.OpenEpisodeRequest(
        environment="calculator", metadata=nulls(EPISODE_METADATA_CHARS + 1, tail=NAN)
    )
    code, details = failure(lambda: env_stub.OpenEpisode(over, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"metadata: more than max_metadata_chars={EPISODE_METADATA_CHARS}")
    # Parameters and the environment are checked first, by name, whatever the metadata holds.
    with_params = env_pb2.OpenEpisodeRequest(environment="calculator", metadata=over.metadata)
    with_params.params.update({"precision": 3})
    code, details = failure(lambda: env_stub.OpenEpisode(with_params, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("params.precision:")
    unknown = env_pb2.OpenEpisodeRequest(environment="nope", metadata=over.metadata)
    code, details = failure(lambda: env_stub.OpenEpisode(unknown, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("environment:")


def calc_call(expression: str, padding: int = 0, call_id: str = "c") -> env_pb2.ToolCall:
    arguments = json.dumps({"expression": expression, "note": "x" * padding})
    return env_pb2.ToolCall(name="calculator", arguments_json=arguments, id=call_id)


def test_step_at_and_just_over_its_limits(channel, env_stub):
    episode = env_stub.OpenEpisode(env_pb2.OpenEpisodeRequest(environment="calculator"), timeout=30)
    at_limit = calc_call(
        "6 * 7", padding=ARGUMENTS_CHARS - len(json.dumps({"expression": "6 * 7", "note": ""}))
    )
    assert len(at_limit.arguments_json) == ARGUMENTS_CHARS
    over = calc_call("6 * 7", padding=ARGUMENTS_CHARS)
    request = env_pb2.StepRequest(episode_id=episode.episode_id, calls=[at_limit] * (MAX_CALLS - 1) + [over])
    health = grpc_health(channel)
    with ThreadPoolExecutor(1) as pool:
        step = pool.submit(env_stub.Step, request, timeout=60)
        while not step.done():
            health()
        results = step.result().results
    assert [(r.content, r.error) for r in results[:-1]] == [("42", False)] * (MAX_CALLS - 1)
    assert results[-1].error and f"at most {ARGUMENTS_CHARS}" in results[-1].content
    # Calls past max_calls_per_step: refused by count, before any call is read; the episode first.
    too_many = env_pb2.StepRequest(episode_id=episode.episode_id, calls=[over] * (MAX_CALLS + 1))
    code, details = failure(lambda: env_stub.Step(too_many, timeout=60))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith(f"calls: {MAX_CALLS + 1} tool calls, at most max_calls_per_step={MAX_CALLS}")
    too_many.episode_id = "no-such-episode"
    code, details = failure(lambda: env_stub.Step(too_many, timeout=60))
    assert code == grpc.StatusCode.NOT_FOUND and details.startswith("episode_id:")
    env_stub.CloseEpisode(env_pb2.CloseEpisodeRequest(episode_id=episode.episode_id), timeout=30)


# --- HTTP /get_reward ------------------------------------------------------------------------------


FORMATTED = "<think>\nx\n</think>\n<answer>\n1\n</answer>"


def label(chars: int) -> dict[str, list[None]]:
    """``{"x": [null, ...]}`` of ``chars`` characters."""
    return {"x": [None] * (chars - 3)}


def post(url: str, body: Any, params: dict[str, str] | None = None) -> requests.Response:
    return requests.post(f"{url}/get_reward", json=body, params=params, timeout=120)


def test_get_reward_at_the_limits_is_served_while_health_answers(server, url, channel):
    """max_samples queries, each ending in 500k characters of end-of-sequence tokens (one at a time, the
    strip copied the text per token: minutes) and labelled with metadata at max_metadata_chars."""
    tail = "<|im_end|>\n" * 20_000 + "</s> " * 60_000
    body = {
        "query": [f"prompt {i}{FORMATTED}{tail}" for i in range(MAX_SAMPLES)],
        "prompts": [f"prompt {i}" for i in range(MAX_SAMPLES)],
        "labels": [label(METADATA_CHARS)] * MAX_SAMPLES,
    }
    grpc_check = grpc_health(channel)

    def health() -> None:
        assert requests.get(f"{url}/health", timeout=30).json()["status"] == "SERVING"
        grpc_check()

    future, answered = served_meanwhile(
        server,
        ("grpo_http_in_flight", {"path": "/get_reward", "method": "POST"}),
        lambda: post(url, body),
        health,
    )
    reply = future.result()
    assert reply.status_code == 200, reply.text
    assert reply.json()["extra_logs"]["format"] == [1.0] * MAX_SAMPLES  # the format ends the completion
    assert answered >= ANSWERED_MEANWHILE


@pytest.mark.parametrize(
    ("body", "params", "status", "field", "message"),
    [
        # Items that are not strings would be 400 query[0]: the count is checked before any item.
        ({"query": [1] * (MAX_SAMPLES + 1)}, None, 413, "query", f"max_samples={MAX_SAMPLES}"),
        (
            {"query": ["a", "b"], "labels": [None, label(METADATA_CHARS + 1)]},
            None,
            400,
            "labels[1]",
            f"more than max_metadata_chars={METADATA_CHARS}",
        ),
        (
            {"query": ["p" + "x" * 2_000_001], "prompts": ["p"]},
            None,
            400,
            "query[0]",
            "max_completion_chars=2000000",
        ),
        ({"query": ["p" * 1001 + "x"], "prompts": ["p" * 1001]}, None, 400, "prompts[0]", "max_prompt_chars"),
        ({"query": ["x" * 17_000_000]}, None, 413, "body", "max_body_bytes"),
        ({"query": ["x"]}, {"rewards": "tag_count,tag_count"}, 400, "rewards[1]", "duplicate"),
        ({"query": ["x"]}, {"rewards": "tag_count", "weights": "nan"}, 400, "weights[0]", "finite"),
    ],
)
def test_get_reward_just_over_a_limit_names_what_the_caller_sent(url, body, params, status, field, message):
    reply = post(url, body, params)
    assert reply.status_code == status, reply.text
    assert reply.json()["field"] == field and message in reply.json()["error"]


def closed_by_server(sock: socket.socket, trickle: bytes, within_s: float) -> bool:
    """Sends ``trickle`` every 0.2 s until the server closes the connection (or answers and closes);
    False when it is still open after ``within_s``."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            sock.sendall(trickle)
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset by the server
            return True
    return False


def test_a_connection_that_trickles_its_headers_is_closed(url, server):
    [endpoint] = server.companions
    with socket.create_connection(("127.0.0.1", endpoint.port)) as sock:
        sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        # Generous: the limit is 1 s; only a missing timeout keeps it open for 30.
        assert closed_by_server(sock, b"a", within_s=30)
    assert requests.get(f"{url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    "head",
    [
        b"GET /"
        + b"a" * 9000
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # a request line over aiohttp's limit
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",  # a header over it
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",  # no colon
    ],
)
def test_an_unparsable_request_is_400_and_logged_at_debug_without_a_traceback(url, server, caplog, head):
    [endpoint] = server.companions
    with caplog.at_level(logging.DEBUG, logger="grpo_runtime.http_companion.server"):
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=30) as sock:
            sock.sendall(head)
            assert sock.recv(65536).split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
        assert requests.get(f"{url}/health", timeout=10).status_code == 200  # the handler has logged by now
    logged = [r for r in caplog.records if r.name == "grpo_runtime.http_companion.server"]
    assert logged and all(r.levelno == logging.DEBUG and r.exc_info is None for r in logged), logged
    assert "Error handling request" in logged[0].getMessage() and "400" in logged[0].getMessage()


def test_a_body_slower_than_its_timeout_is_408(url, server):
    [endpoint] = server.companions
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=30) as sock:
        sock.sendall(
            b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"query": '
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, "closed without an answer"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408")


def test_repeated_fields_past_their_limits_are_refused_by_count(channel):
    """Token ids, prompt messages and attack names are refused by how many there are: each item here is
    also wrong (no role, an unknown attack), which reading any of them would report instead."""
    stub = reward_pb2_grpc.RewardServiceStub(channel)
    ids = score_request(1)
    ids.samples[0].completion_ids.extend([1] * (2**18 + 1))
    code, details = failure(lambda: stub.Score(ids, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("samples[0].completion_ids: 262145 token ids, at most max_completion_ids=")
    messages = score_request(1)
    for _ in range(1001):
        messages.samples[0].prompt.add(content="x")
    code, details = failure(lambda: stub.Score(messages, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("samples[0].prompt: 1001 messages, more than max_prompt_chars=1000")
    attacks = reward_pb2.StressRewardRequest(
        samples=score_request(1).samples, rewards=ids.rewards, attacks=["nope"] * 100_000
    )
    code, details = failure(lambda: stub.StressReward(attacks, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("attacks: 100000 attack names")
