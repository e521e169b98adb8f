"""RewardClient and the TRL reward function it builds, against a real server."""

from __future__ import annotations

import concurrent.futures
import pickle
import socket
import time

import numpy as np
import pytest

from grpo_runtime.call_errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from reward_service.client import RewardClient, RewardDescription, trl_samples
from reward_service.core.types import Sample

RIGHT, WRONG = r"The answer is \boxed{\frac{1}{2}}", r"The answer is \boxed{3}"


@pytest.fixture(scope="module")
def client(reward_server):
    with RewardClient(reward_server.address, timeout_s=30) as c:
        yield c


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_accuracy_reward_func_conversational(client):
    f = client.as_reward_func("accuracy")
    assert f.__name__ == "accuracy"
    prompts = [[{"role": "user", "content": "1/2?"}]] * 2 + [[{"role": "user", "content": "x?"}]]
    logged = {}
    out = f(
        prompts=prompts,
        completions=[_chat(RIGHT), _chat(WRONG), _chat(RIGHT)],
        completion_ids=[[1, 2], [3], [4]],
        answer=["0.5", "0.5", "not a number at all"],
        difficulty=[np.int64(3), np.float32(0.5), None],
        trainer_state=object(),
        log_extra=lambda column, values: logged.setdefault(column, values),
        log_metric=lambda name, value: None,
    )
    assert out == [1.0, 0.0, None]
    assert logged["accuracy_error"][2] and not logged["accuracy_error"][0]


def test_spec_with_weight_and_params_and_plain_strings(client):
    f = client.as_reward_func(("format", 0.5, {"style": "think"}))
    out = f(prompts=["p", "p"], completions=["<think>a</think> b", "no think"])
    assert out == [0.5, 0.0]
    assert f.__name__ == "format"


def test_groups_follow_consecutive_prompts(client):
    # Two prompts x two generations, as TRL lays them out: length normalises within each group.
    f = client.as_reward_func("length")
    prompts = ["a", "a", "b", "b"]
    completions = [r"\boxed{2}", r"\boxed{2} and more words", r"\boxed{2}", r"\boxed{2}" + "x" * 40]
    out = f(prompts=prompts, completions=completions, answer=["2"] * 4)
    assert out == pytest.approx([0.5, -0.5, 0.5, -0.5])
    groups = [s.group for s in trl_samples(prompts, completions, None, {})]
    assert groups[0] == groups[1] != groups[2] == groups[3]


def test_score_returns_components(client):
    results = client.score(
        [Sample(id="s", completion=RIGHT, metadata={"answer": "1/2"})], ["accuracy", ("tag_count", 2.0)]
    )
    assert results[0].id == "s"
    assert [name for name, _ in results[0].components] == ["accuracy", "tag_count"]


def test_list_rewards_returns_domain_descriptions(client):
    offered = {info.name: info for info in client.list_rewards()}
    assert isinstance(offered["format"], RewardDescription) and offered["format"].available
    assert offered["accuracy"].required_metadata  # the gold answer column
    assert {p.name for p in offered["format"].params} >= {"style"}


def test_reward_func_pickles(client):
    f = pickle.loads(pickle.dumps(client.as_reward_func("tag_count")))
    assert f(prompts=["p"], completions=["<think>\nx\n</think>\n"]) == [0.5]
    f.client.close()


def test_bad_spec_raises_invalid_argument_without_retrying(client):
    f = client.as_reward_func(("cosine", 1.0, {"max_len": -3}))
    with pytest.raises(InvalidArgumentError) as err:
        f(prompts=["p"], completions=["x"], answer=["1"])
    assert err.value.code.name == "INVALID_ARGUMENT" and "rewards[0].params.max_len" in err.value.details
    assert err.value.field == "rewards[0].params.max_len" and not err.value.retryable


def test_service_down_raises_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    f = RewardClient(f"127.0.0.1:{port}", timeout_s=2, retry_budget_s=1.0).as_reward_func("format")
    start = time.monotonic()
    with pytest.raises(UnavailableError) as err:
        f(prompts=["p"], completions=["x"])
    assert err.value.code.name == "UNAVAILABLE" and str(err.value).startswith("reward service: UNAVAILABLE: ")
    assert time.monotonic() - start < 15


def test_request_over_a_size_limit_fails_at_once_without_retrying(reward_server, caplog):
    # max_samples is 8 on this server: a refusal that can never succeed is not retried for the budget.
    client = RewardClient(reward_server.address, timeout_s=30, retry_budget_s=60)
    samples = [Sample(id=str(i), completion="x") for i in range(9)]
    refused = pytest.raises(ResourceExhaustedError)
    with caplog.at_level("WARNING", logger="reward_service.client"), refused as err:
        client.score(samples, ["format"])
    client.close()
    assert err.value.code.name == "RESOURCE_EXHAUSTED" and "max_samples" in err.value.details
    assert err.value.retry_after_s is None
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_concurrency_refusal_is_retried_until_a_slot_frees(reward_server, caplog):
    # Fill the server's three request slots with slow sandboxed programs, then score: the client is refused,
    # waits for the pushback it is sent and gets its scores once a slot frees.
    sleeper = "```python\nimport time\ntime.sleep(1.8)\nprint('ok')\n```"
    slow = [Sample(id="slow", completion=sleeper, metadata={"expected": "ok"})]
    busy = [RewardClient(reward_server.address, timeout_s=30) for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        held = [pool.submit(c.score, slow, ["code"]) for c in busy]
        time.sleep(0.5)
        client = RewardClient(reward_server.address, timeout_s=30, retry_budget_s=30)
        with caplog.at_level("WARNING", logger="reward_service.client"):
            results = client.score([Sample(id="s", completion="<think>a</think> b")], ["format"])
        client.close()
        assert [len(f.result()) for f in held] == [1, 1, 1]
    for c in busy:
        c.close()
    assert results[0].reward is not None
    assert any("RESOURCE_EXHAUSTED" in r.getMessage() for r in caplog.records)
