"""RewardClient and the TRL reward function it builds, against a real server."""

from __future__ import annotations

import pickle
import socket
import time

import numpy as np
import pytest

from reward_service.client import RewardClient, RewardServiceError, trl_samples
from reward_service.types import Sample

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


def test_reward_func_pickles(client):
    f = pickle.loads(pickle.dumps(client.as_reward_func("tag_count")))
    assert f(prompts=["p"], completions=["<think>\nx\n</think>\n"]) == [0.5]
    f.client.close()


def test_bad_spec_raises_invalid_argument_without_retrying(client):
    f = client.as_reward_func(("cosine", 1.0, {"max_len": -3}))
    with pytest.raises(RewardServiceError) as err:
        f(prompts=["p"], completions=["x"], answer=["1"])
    assert err.value.code.name == "INVALID_ARGUMENT" and "rewards[0].params.max_len" in err.value.details


def test_service_down_raises_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    f = RewardClient(f"127.0.0.1:{port}", timeout_s=2, retry_budget_s=1.0).as_reward_func("format")
    start = time.monotonic()
    with pytest.raises(RewardServiceError) as err:
        f(prompts=["p"], completions=["x"])
    assert err.value.code.name == "UNAVAILABLE"
    assert time.monotonic() - start < 15
