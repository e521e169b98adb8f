"""The OpenRLHF-compatible HTTP endpoint (POST /get_reward, GET /health) of a real reward server on loopback,
called as OpenRLHF's remote_rm_fn calls it (requests.post with a JSON body)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_runtime.server import BindError, GrpcServer
from reward_service.client import RewardClient
from reward_service.core.types import Message, RewardRequest, Sample
from reward_service.http import healthcheck
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread

HTTP_SETTINGS = {
    **SETTINGS,
    "http": {
        "port": 0,
        "rewards": [
            {"name": "accuracy", "weight": 1.0},
            {"name": "format", "weight": 0.5, "params": {"style": "r1"}},
        ],
        "max_body_bytes": 200_000,
    },
}


def chat_prompt(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


GOOD = "<think>\nhalf and half\n</think>\n<answer>\n\\boxed{1}\n</answer>"
PROMPTS = [chat_prompt("What is 1/2 + 1/2?"), chat_prompt("What is 2 + 2?")]
QUERIES = [PROMPTS[0] + GOOD + "<|im_end|>", PROMPTS[1] + "it is \\boxed{5}<|endoftext|>"]
LABELS = ["1", "4"]


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with reward_server_thread(HTTP_SETTINGS) as running:
        yield running


@pytest.fixture(scope="module")
def url(server) -> str:
    [endpoint] = server.companions
    return f"http://127.0.0.1:{endpoint.port}"


def post(url: str, body, params: dict | None = None, **kwargs) -> requests.Response:
    return requests.post(f"{url}/get_reward", params=params, timeout=60, **kwargs, json=body)


def test_get_reward_in_openrlhf_format_scores_like_grpc(server, url):
    reply = post(url, {"query": QUERIES, "prompts": PROMPTS, "labels": LABELS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["rewards"] == [1.5, 0.0]
    # accuracy in [0, 1] + 0.5 · format in [0, 1]: the score range is [0, 1.5].
    assert body["scores"] == [1.0, 0.0]
    assert body["extra_logs"] == {
        "accuracy": [1.0, 0.0],
        "format": [1.0, 0.0],
        "reward_missing": [0.0, 0.0],
    }
    # The same samples through gRPC Score give the same rewards: one scorer behind both.
    samples = [
        Sample(id="0", completion=GOOD, prompt=(Message("user", PROMPTS[0]),), metadata={"answer": "1"}),
        Sample(
            id="1",
            completion="it is \\boxed{5}",
            prompt=(Message("user", PROMPTS[1]),),
            metadata={"answer": "4"},
        ),
    ]
    rewards = [RewardRequest("accuracy", 1.0), RewardRequest("format", 0.5, {"style": "r1"})]
    with RewardClient(server.address) as client:
        results = client.score(samples, rewards)
    assert [result.reward for result in results] == body["rewards"]


def test_rewards_and_weights_from_the_query_string(url):
    reply = post(
        url,
        {"query": QUERIES, "prompts": PROMPTS, "labels": LABELS},
        {"rewards": "format,accuracy", "weights": "2,-1"},
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["rewards"] == [1.0, 0.0]
    assert list(body["extra_logs"]) == ["format", "accuracy", "reward_missing"]
    # Range [-1, 2] for 2·format − accuracy.
    assert body["scores"] == pytest.approx([2 / 3, 1 / 3])


def test_object_labels_are_metadata_and_unscored_samples_get_missing_reward(url):
    reply = post(
        url,
        {"query": ["\\boxed{7}", "x"], "labels": [{"answer": "7"}, None]},
        {"rewards": "accuracy"},
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    # No prompts: the whole query is the completion. The second sample has no gold: no value, missing_reward.
    assert body["rewards"] == [1.0, 0.0]
    assert body["extra_logs"]["reward_missing"] == [0.0, 1.0]


# OpenRLHF's clients, as its releases write them: the body, the sharding across --remote_rm_url and what is
# read back. 0.9: RemoteRewardModel.get_rewards (openrlhf/utils/remote_rm_utils.py) posts each URL a
# ceil(n / URLs) slice with requests, and update_samples_with_rewards (experience_maker.py) concatenates the
# answers under the FIRST answer's keys. 0.11: SingleTurnAgentExecutor (openrlhf/utils/agent.py) scores one
# sample at a time, so every URL after the first gets empty lists; it posts with aiohttp and reads the first
# answer. Each raises (and OpenRLHF has no reward for the samples) when any URL answers with an error.


def openrlhf_09_rewards(urls: list[str], queries: list, prompts: list, labels: list) -> dict:
    batch = (len(queries) + len(urls) - 1) // len(urls)
    infos = []
    for i, rm in enumerate(urls):
        data = {
            k: v[i * batch : (i + 1) * batch]
            for k, v in (("query", queries), ("prompts", prompts), ("labels", labels))
        }
        response = requests.post(url=rm, json=data, headers={"Content-Type": "application/json"}, timeout=180)
        response.raise_for_status()
        infos.append(response.json())
    merged = {"rewards": [r for info in infos for r in info["rewards"]]}
    if "scores" in infos[0]:
        merged["scores"] = [s for info in infos for s in info["scores"]]
    if "extra_logs" in infos[0]:
        merged["extra_logs"] = {
            k: [v for info in infos for v in info["extra_logs"][k]] for k in infos[0]["extra_logs"]
        }
    return merged


async def openrlhf_011_rewards(urls: list[str], query: str, prompt: str, label: str) -> dict:
    batch = (1 + len(urls) - 1) // len(urls)
    timeout = aiohttp.ClientTimeout(total=180)

    async def post_one(rm: str, data: dict) -> dict:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(rm, json=data) as response:
            response.raise_for_status()
            return await response.json()

    payloads = [
        {
            "query": [query][i * batch : (i + 1) * batch],
            "prompts": [prompt][i * batch : (i + 1) * batch],
            "labels": [label][i * batch : (i + 1) * batch],
        }
        for i in range(len(urls))
    ]
    assert payloads[-1] == {"query": [], "prompts": [], "labels": []}  # what a second URL is sent
    [first, *_] = await asyncio.gather(*(post_one(rm, data) for rm, data in zip(urls, payloads, strict=True)))
    return first


def left_truncated(prompt: str, kept_bytes: int) -> str:
    """The decoded tail OpenRLHF 0.11 generates from when a prompt is past max_len: its last tokens, here one
    per UTF-8 byte (a byte-level BPE at its finest), so a cut inside a character decodes as U+FFFD."""
    return prompt.encode()[-kept_bytes:].decode(errors="replace")


@pytest.mark.parametrize("urls", [1, 2, 3])
def test_openrlhf_09_batches_over_several_urls(url, urls):
    endpoints = [f"{url}/get_reward"] * urls
    answer = openrlhf_09_rewards(
        endpoints, [QUERIES[0], QUERIES[1], QUERIES[0]], PROMPTS + PROMPTS[:1], LABELS + LABELS[:1]
    )
    assert answer == {
        "rewards": [1.5, 0.0, 1.5],
        "scores": [1.0, 0.0, 1.0],
        "extra_logs": {
            "accuracy": [1.0, 0.0, 1.0],
            "format": [1.0, 0.0, 1.0],
            "reward_missing": [0.0, 0.0, 0.0],
        },
    }
    # One sample over two URLs: the second is sent empty lists and answers them under the same keys.
    assert openrlhf_09_rewards(endpoints[:1] * 2, QUERIES[:1], PROMPTS[:1], LABELS[:1])["rewards"] == [1.5]


# A Chinese question, kept from 等 (60 bytes), from inside it (59, 58: U+FFFD), from inside the English.
TRUNCATED_PROMPT = chat_prompt("一加一等于几？ What is 1/2 + 1/2?")


@pytest.mark.parametrize("kept_bytes", [None, 60, 59, 58, 40])
async def test_openrlhf_011_left_truncated_prompt_over_two_urls(url, kept_bytes):
    kept = TRUNCATED_PROMPT if kept_bytes is None else left_truncated(TRUNCATED_PROMPT, kept_bytes)
    assert kept_bytes is None or not TRUNCATED_PROMPT.startswith(kept)
    answer = await openrlhf_011_rewards(
        [f"{url}/get_reward"] * 2, kept + GOOD + "<|im_end|>", TRUNCATED_PROMPT, "1"
    )
    assert answer["rewards"] == [1.5] and answer["scores"] == [1.0]


def test_an_empty_request_answers_empty_lists_under_the_rewards_keys(url):
    reply = post(url, {"query": [], "prompts": [], "labels": []}, {"rewards": "format,accuracy"})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "rewards": [],
        "scores": [],
        "extra_logs": {"format": [], "accuracy": [], "reward_missing": []},
    }


def test_requests_are_counted_on_the_servers_metrics_registry(server, url):
    """Every request is counted by route, method and status with its latency, on the registry the server's
    /metrics exports; paths the router does not know share one label."""
    registry = server.metrics.registry

    def count(path: str, method: str, code: str) -> float:
        labels = {"path": path, "method": method, "code": code}
        return registry.get_sample_value("grpo_http_requests_total", labels) or 0.0

    def timed(path: str, method: str) -> float:
        labels = {"path": path, "method": method}
        return registry.get_sample_value("grpo_http_request_duration_seconds_count", labels) or 0.0

    def snapshot() -> dict[str, float]:
        return {
            "ok": count("/get_reward", "POST", "200"),
            "bad": count("/get_reward", "POST", "400"),
            "health": count("/health", "GET", "200"),
            "unknown": count("unmatched", "GET", "404"),
            "wrong_method": count("unmatched", "POST", "405"),
            "timed": timed("/get_reward", "POST"),
        }

    before = snapshot()
    assert post(url, {"query": QUERIES, "prompts": PROMPTS, "labels": LABELS}).status_code == 200
    assert requests.post(f"{url}/get_reward", data=b"{", timeout=60).status_code == 400
    assert requests.get(f"{url}/health", timeout=60).status_code == 200
    for i in range(3):  # hostile paths: one label between them
        assert requests.get(f"{url}/no-such-path-{i}", timeout=60).status_code == 404
    assert requests.post(f"{url}/health", timeout=60).status_code == 405
    after = snapshot()
    deltas = {key: after[key] - before[key] for key in before}
    assert deltas == {"ok": 1, "bad": 1, "health": 1, "unknown": 3, "wrong_method": 1, "timed": 2}
    assert registry.get_sample_value("grpo_http_in_flight", {"path": "/get_reward", "method": "POST"}) == 0
    assert not [s for m in registry.collect() for s in m.samples if "no-such-path" in str(s.labels)]


def test_health(url):
    reply = requests.get(f"{url}/health", timeout=10)
    assert reply.status_code == 200 and reply.json()["status"] == "SERVING"


def test_the_container_healthcheck_asks_both_ports(server, url, capsys):
    [endpoint] = server.companions
    assert healthcheck.main(["--port", str(server.port), "--http-port", str(endpoint.port)]) == 0
    # A port nobody serves on: gRPC's (the server's HTTP port) or HTTP's (the gRPC port) fails the check.
    assert (
        healthcheck.main(["--port", str(endpoint.port), "--http-port", str(endpoint.port), "--timeout", "2"])
        == 1
    )
    assert (
        healthcheck.main(["--port", str(server.port), "--http-port", str(server.port), "--timeout", "2"]) == 1
    )
    assert f"127.0.0.1:{server.port}/health" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("body", "params", "status", "field"),
    [
        (
            {"query": [PROMPTS[0] + "x", "no prompt here"], "prompts": PROMPTS, "labels": LABELS},
            None,
            400,
            "query[1]",
        ),
        ({"query": QUERIES, "prompts": PROMPTS[:1]}, None, 400, "prompts"),
        ({"query": QUERIES, "labels": ["1"]}, None, 400, "labels"),
        ({"query": "not a list"}, None, 400, "query"),
        ({"query": [1, 2]}, None, 400, "query[0]"),
        ({"prompts": PROMPTS}, None, 400, "query"),
        ([1, 2, 3], None, 400, "body"),
        ({"query": ["a"], "labels": [True]}, None, 400, "labels[0]"),
        ({"query": ["a"]}, {"rewards": "no_such_reward"}, 400, "rewards[0]"),
        ({"query": ["a"]}, {"rewards": "accuracy", "weights": "inf"}, 400, "weights[0]"),
        ({"query": ["a"]}, {"rewards": "accuracy", "weights": "1,2"}, 400, "weights"),
        ({"query": ["a"]}, {"rewards": "accuracy,"}, 400, "rewards[1]"),
        ({"query": ["a"]}, {"weights": "1"}, 400, "weights"),
        ({"query": ["a"] * 9}, None, 413, "query"),
        ({"query": ["x" * 300_000]}, None, 413, "body"),
    ],
)
def test_hostile_requests_get_4xx_naming_the_field(url, body, params, status, field):
    reply = post(url, body, params)
    assert reply.status_code == status, reply.text
    assert reply.json()["field"] == field


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"query": [NaN]}',
        b'{"query": ["a"], "labels": [Infinity]}',
        b"[" * 100_000,
        b"\xff\xfe",
    ],
)
def test_bodies_that_are_not_json_are_400(url, raw):
    reply = requests.post(f"{url}/get_reward", data=raw, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["field"] == "body"


def test_deeply_nested_labels_are_refused(url):
    label: dict = {}
    node = label
    for _ in range(40):
        node["a"] = {}
        node = node["a"]
    reply = post(url, {"query": ["a"], "labels": [label]}, {"rewards": "accuracy"})
    assert reply.status_code == 400 and reply.json()["field"] == "labels[0]"


def test_an_http_port_in_use_fails_the_start_with_bind_error(server):
    [endpoint] = server.companions
    taken = {**HTTP_SETTINGS, "http": {"port": endpoint.port}}
    with pytest.raises(BindError, match="cannot bind HTTP"), reward_server_thread(taken):
        pass


def test_the_concurrency_bound_is_429_with_retry_after(url):
    """max_concurrent_requests (3 here) requests hold the scorer (sandboxed programs that sleep); the next is
    refused at once with 429 and Retry-After, as gRPC refuses it with RESOURCE_EXHAUSTED + pushback."""
    sleeper = "```python\nimport time\ntime.sleep(1.8)\nprint('ok')\n```"
    body = {"query": [sleeper], "labels": [{"expected": "ok"}]}
    with ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(post, url, body, {"rewards": "code"}) for _ in range(3)]
        deadline = time.monotonic() + 60
        while requests.get(f"{url}/health", timeout=10).json()["in_flight"] < 3:
            assert time.monotonic() < deadline, "the slow requests never ran together"
            time.sleep(0.02)
        refused = post(url, {"query": ["x"]}, {"rewards": "format"})
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert all(f.result().status_code == 200 for f in slow)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)  # requests refuses to encode them
        | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(["query", "prompts", "labels", "x"]) | st.text(max_size=6), inner
            )
        ),
        max_leaves=15,
    ),
    rewards=st.none() | st.sampled_from(["accuracy", "format,accuracy", "x", ",", "prm:none"]),
)
def test_any_json_body_gets_200_or_a_client_error(url, body, rewards):
    reply = post(url, body, {"rewards": rewards} if rewards is not None else None)
    assert reply.status_code in (200, 400, 413, 429), reply.text
    if reply.status_code == 200:
        assert set(reply.json()) == {"rewards", "scores", "extra_logs"}


# OpenRLHF-shaped bodies: prompts that do and do not prefix their queries, runs of end-of-sequence tokens,
# labels of every JSON kind, lists of mismatched lengths, counts around max_samples (8 here).
tails = st.lists(
    st.sampled_from(["<|im_end|>", "<|endoftext|>", "</s>", " ", "\n", "x", "\\boxed{1}", GOOD]), max_size=12
).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
labels = json_values | st.sampled_from(["1", "4", 7])
INDEXED = re.compile(r"^(query|prompts|labels|rewards|weights)\[(\d+)\]")


@st.composite
def openrlhf_bodies(draw) -> dict:
    count = draw(st.integers(0, 10))
    prompts = [draw(st.sampled_from([*PROMPTS, "", "p"]) | st.text(max_size=8)) for _ in range(count)]
    queries = [p + draw(tails) if draw(st.booleans()) else draw(st.text(max_size=20)) for p in prompts]
    body: dict = {"query": queries}
    if draw(st.booleans()):
        body["prompts"] = prompts[: draw(st.integers(0, count))] if draw(st.booleans()) else prompts
    if draw(st.booleans()):
        body["labels"] = [draw(labels) for _ in range(count + draw(st.sampled_from([0, 0, 0, 1])))]
    return body


def _names_only_what_was_sent(field: str | None, body: dict, params: dict) -> None:
    """An index in an error's field is one the request has."""
    match = INDEXED.match(field or "")
    if match is None:
        return
    key, index = match.group(1), int(match.group(2))
    sent = params[key].split(",") if key in ("rewards", "weights") else body[key]
    assert index < len(sent), (field, body, params)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=openrlhf_bodies(),
    rewards=st.none()
    | st.sampled_from(["accuracy", "format,accuracy", "format,format", "x", ",", "prm:none"]),
    weights=st.none() | st.sampled_from(["1", "2,0.5", "nan", "x", "1e308,1e308"]),
)
def test_openrlhf_bodies_get_200_or_a_client_error_naming_what_was_sent(url, body, rewards, weights):
    params = {k: v for k, v in (("rewards", rewards), ("weights", weights)) if v is not None}
    reply = post(url, body, params)
    assert reply.status_code in (200, 400, 413, 429), reply.text
    answer = reply.json()
    if reply.status_code == 200:
        assert len(answer["rewards"]) == len(answer["scores"]) == len(body["query"])
        assert all(math.isfinite(r) for r in answer["rewards"])
        assert all(0.0 <= s <= 1.0 for s in answer["scores"])
    else:
        _names_only_what_was_sent(answer["field"], body, params)
    assert requests.get(f"{url}/health", timeout=10).json()["status"] == "SERVING"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300) | json_values.map(lambda v: json.dumps({"query": v}).encode()))
def test_any_bytes_get_a_client_error_or_200(url, raw):
    reply = requests.post(f"{url}/get_reward", data=raw, timeout=60)
    assert reply.status_code in (200, 400, 413, 429), reply.text
    assert requests.get(f"{url}/health", timeout=10).json()["status"] == "SERVING"
