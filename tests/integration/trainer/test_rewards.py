"""The run's reward functions against a real reward service: one Score call per batch for every term, with the
same values as one call per term."""

from __future__ import annotations

import pytest

from grpo_runtime.config import ConfigError
from reward_service.client import RewardClient
from reward_service.server import build
from reward_service.settings import load_settings
from tests.support.server_thread import server_thread
from trainer_service.config.reward_terms import RewardTerm
from trainer_service.training.job import reward_requirements
from trainer_service.training.rewards import BatchScorer

TERMS = [RewardTerm(name="accuracy"), RewardTerm(name="repetition_penalty", weight=0.5)]


def batch(answers: list[str]) -> dict:
    """A TRL batch of two groups (G = 2), as TRL hands it to every reward function."""
    questions = ["What is 1 + 1?"] * 2 + ["What is 2 + 2?"] * 2
    return {
        "prompts": [[{"role": "user", "content": question}] for question in questions],
        "completions": [[{"role": "assistant", "content": text}] for text in answers],
        "completion_ids": None,
        "answer": ["2", "2", "4", "4"],
    }


def score_calls(server) -> float:
    return sum(
        sample.value
        for family in server.metrics.registry.collect()
        if family.name == "grpo_rpc_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("method") == "Score"
    )


def test_one_score_call_per_batch_gives_each_term_its_own_values():
    with server_thread(lambda: build(load_settings({}))) as server, RewardClient(server.address) as client:
        functions = BatchScorer(client, TERMS).reward_funcs()
        assert [f.__name__ for f in functions] == ["accuracy", "repetition_penalty"]
        first = batch([r"\boxed{2}", r"the the the the the \boxed{3}", r"\boxed{4}", "four"])
        values = {f.__name__: f(**first) for f in functions}
        assert score_calls(server) == 1
        second = batch([r"\boxed{3}", r"\boxed{2}", r"\boxed{4}", r"\boxed{4}"])
        later = {f.__name__: f(**second) for f in functions}
        assert score_calls(server) == 2

        # What one Score call per term (weight 1, TRL applies reward_weights) gives for the same batches.
        for term in TERMS:
            alone = client.as_reward_func((term.name, 1.0, term.params))
            assert alone(**first) == values[term.name]
            assert alone(**second) == later[term.name]
        assert values["accuracy"] == [1.0, 0.0, 1.0, 0.0]
        assert later["accuracy"] == [0.0, 1.0, 1.0, 1.0]
        assert values["repetition_penalty"][0] == 0.0  # nothing repeated
        assert values["repetition_penalty"][1] < 0.0


def test_soft_overlong_takes_the_runs_max_completion_length():
    lengths = [50, 80, 90, 110]
    columns = {
        "prompts": [[{"role": "user", "content": "Count."}]] * 4,
        "completions": [[{"role": "assistant", "content": "1 " * n}] for n in lengths],
        "completion_ids": [[1] * n for n in lengths],
    }
    with server_thread(lambda: build(load_settings({}))) as server, RewardClient(server.address) as client:
        # L_max = 100 from the run, L_c = 100 // 4: 0 up to 75 tokens, then down to -1 at 100.
        [from_run] = BatchScorer(client, [RewardTerm(name="soft_overlong")], 100).reward_funcs()
        assert from_run(**columns) == pytest.approx([0.0, -0.2, -0.6, -1.0])
        # What the user set wins: L_max 100 with their L_c 20 (TRL's golden -0.5 at 90 tokens).
        term = RewardTerm(name="soft_overlong", params={"soft_punish_cache": 20})
        [user_cache] = BatchScorer(client, [term], 100).reward_funcs()
        assert user_cache(**columns) == pytest.approx([0.0, 0.0, -0.5, -1.0])
        term = RewardTerm(name="soft_overlong", params={"max_completion_len": 1000, "soft_punish_cache": 200})
        [user_max] = BatchScorer(client, [term], 100).reward_funcs()
        assert user_max(**columns) == [0.0, 0.0, 0.0, 0.0]
        # Without the run's length (as before): the service's defaults, 16384 / 4096.
        [service_defaults] = BatchScorer(client, [RewardTerm(name="soft_overlong")]).reward_funcs()
        assert service_defaults(**columns) == [0.0, 0.0, 0.0, 0.0]


def test_model_rewards_may_be_loaded_after_the_run_starts_but_unknown_rules_are_refused():
    with server_thread(lambda: build(load_settings({}))) as server, RewardClient(server.address) as client:
        terms = [RewardTerm(name=name) for name in ("accuracy", "prm:math", "orm:helpful", "judge:strict")]
        requirements = reward_requirements(client, terms)
        assert "answer" in "|".join(requirements["accuracy"])
        assert not {"prm:math", "orm:helpful", "judge:strict"} & requirements.keys()
        with pytest.raises(ConfigError, match="'judges:strict' is not offered") as refused:
            reward_requirements(client, [RewardTerm(name="judges:strict")])
        assert refused.value.key == "training.rewards.reward_fn"
