"""Trainer side of tool episodes: config keys, the per-prompt episode plan, what TRL gets back."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig

from rollout_service.types import CompletionResult, FinishReason, TurnSpan
from tests.unit.trainer.fixtures import length_reward, offset_rollout
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.rollout.episodes import EnvironmentReward, EpisodePlan, episode_plan, tool_metrics
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync
from trainer_service.training.variant_trainer import make_variant_trainer

PROMPT = [{"role": "user", "content": "What is 123 * 456?"}]
OTHER = [{"role": "user", "content": "What is 2 + 2?"}]


def config(**training):
    return parse_config({"base": "m", "data": {"train": "t.jsonl"}, "training": training})


def test_config_takes_trl_names_and_one_environment_form():
    c = config(
        tools={"environment": "calculator", "max_tool_calling_iterations": 3},
        rewards={"environment_weight": 0.5},
    )
    assert [e.name for e in c.training.tools.episode_environments] == ["calculator"]
    assert c.training.tools.max_model_turns == 4  # iterations of tool calling + the answer turn
    c = config(
        tools={
            "environments": [{"name": "python", "params": {"timeout_s": 2}}, "calculator"],
            "max_tool_calling_iterations": 2,
        }
    )
    assert [(e.name, e.params) for e in c.training.tools.episode_environments] == [
        ("python", {"timeout_s": 2}),
        ("calculator", {}),
    ]
    with pytest.raises(ConfigError, match="environment or environments"):
        config(tools={"environment": "a", "environments": ["b"]})
    with pytest.raises(ConfigError, match=r"training\.max_turns: moved to training\.tools\.max_tool_calling"):
        config(max_turns=2, tools={"environment": "a"})
    assert config().training.tools.episode_environments == []
    assert episode_plan(config(), [{"prompt": PROMPT}]) is None


def test_plan_attaches_each_rows_columns_and_its_environment():
    c = config(tools={"environments": ["calculator", "python"], "max_tool_calling_iterations": 2})
    rows = [
        {"prompt": PROMPT, "answer": "56088"},
        {"prompt": OTHER, "answer": "4", "environment": "python", "score": float("nan")},
    ]
    plan = episode_plan(c, rows)
    first, second = plan.spec(PROMPT), plan.spec(OTHER)
    assert (first.environment, first.metadata, first.max_turns) == ("calculator", {"answer": "56088"}, 3)
    assert second.environment == "python" and second.metadata["score"] is None  # Struct-safe
    assert plan.spec([{"role": "user", "content": "unseen"}]).metadata == {}


def test_the_rollout_skips_the_environment_reward_a_run_does_not_weigh():
    weighed = episode_plan(config(tools={"environment": "calculator"}), [{"prompt": PROMPT}])
    unweighed = episode_plan(
        config(tools={"environment": "calculator"}, rewards={"environment_weight": 0.0}), [{"prompt": PROMPT}]
    )
    assert not weighed.spec(PROMPT).skip_reward and unweighed.spec(PROMPT).skip_reward


def test_plan_refuses_an_environment_the_run_does_not_have():
    plan = EpisodePlan(
        config(tools={"environment": "calculator"}).training.tools.episode_environments,
        [{"prompt": PROMPT, "environment": "browser"}],
    )
    with pytest.raises(ValueError, match="browser"):
        plan.spec(PROMPT)


def episode(tool_mask, reward, calls=1, failures=0, finish=FinishReason.STOP) -> CompletionResult:
    n = len(tool_mask)
    return CompletionResult(
        "0",
        [1, 2],
        list(range(5, 5 + n)),
        "t",
        [-0.5 if m else 0.0 for m in tool_mask],
        finish,
        3,
        tool_mask=list(tool_mask),
        turns=[TurnSpan(0, n, 3)],
        tool_call_count=calls,
        tool_failure_count=failures,
        env_reward=reward,
    )


def test_to_trl_passes_the_tool_mask_as_env_mask_and_the_env_reward():
    plan = episode_plan(config(tools={"environment": "calculator"}), [{"prompt": PROMPT}])
    rollout = ServiceRollout(None, WeightSync(client=None), SamplingConfig(1.0, 1.0, 8), 2, episodes=plan)
    completions = [
        episode([1, 1, 0, 0, 1], 1.0, calls=1),
        episode([1, 1], None, calls=2, failures=1),
        episode([1], 0.5, calls=0, finish=FinishReason.ERROR),
    ]
    out = rollout.to_trl(completions, expected_version=3)
    assert out["env_mask"] == [[1, 1, 0, 0, 1], [1, 1], [1]]
    assert out["env_reward"] == [1.0, None, None]  # a failed episode has no environment reward
    assert rollout.last_tool_metrics == {
        "tools/call_frequency": 1.0,
        "tools/failure_frequency": 1 / 3,
        "tools/episode_error_frequency": 1 / 3,
    }
    assert EnvironmentReward()(completions=[[], [], []], env_reward=out["env_reward"]) == [1.0, None, None]


def test_an_episode_without_tokens_gets_one_end_token_out_of_the_loss():
    """An episode that could not open has no token; TRL reads each completion's last id."""
    plan = episode_plan(config(tools={"environment": "calculator"}), [{"prompt": PROMPT}], end_token_id=2)
    rollout = ServiceRollout(None, WeightSync(client=None), SamplingConfig(1.0, 1.0, 8), 2, episodes=plan)
    unopened = episode([], None, calls=0, finish=FinishReason.ERROR)
    out = rollout.to_trl([episode([1, 0, 1], 1.0), unopened], expected_version=3)
    assert out["completion_ids"] == [[5, 6, 7], [2]]
    assert out["logprobs"][1] == [0.0] and out["env_mask"] == [[1, 0, 1], [0]]
    assert unopened.token_ids == []  # the rollout's result itself is left as it came


def test_to_trl_refuses_a_tool_mask_that_does_not_cover_the_tokens():
    plan = episode_plan(config(tools={"environment": "calculator"}), [{"prompt": PROMPT}])
    rollout = ServiceRollout(None, WeightSync(client=None), SamplingConfig(1.0, 1.0, 8), 2, episodes=plan)
    broken = episode([1, 0], 1.0)
    broken.tool_mask = [1]
    with pytest.raises(RuntimeError, match="tool_mask"):
        rollout.to_trl([broken], expected_version=3)


def test_single_turn_runs_return_no_episode_keys():
    rollout = ServiceRollout(None, WeightSync(client=None), SamplingConfig(1.0, 1.0, 8), 2)
    out = rollout.to_trl([episode([1, 1], None)], expected_version=3)
    assert "env_mask" not in out and rollout.last_tool_metrics == {}
    assert tool_metrics([]) == {}
    assert math.isclose(tool_metrics([episode([1], None, calls=0)])["tools/failure_frequency"], 0.0)


MASKS = [[1, 1, 0, 0, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_trl_trains_on_model_tokens_only(policy_dir, tokenizer, tmp_path):
    """The env_mask a rollout returns reaches TRL's loss: the loss equals the loss with those tokens cut from
    completion_mask, and differs from the loss that keeps them."""
    base = offset_rollout(tokenizer, offset=0.0)

    def rollout(prompts, trainer):
        out = base(prompts, trainer)
        out["env_mask"] = [MASKS[i % len(MASKS)] for i in range(len(prompts))]
        return out

    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=5,
        vllm_importance_sampling_correction=False,
        seed=11,
    )
    trainer = make_variant_trainer("standard")(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        args=args,
        reward_funcs=length_reward,
        train_dataset=Dataset.from_dict({"prompt": ["one plus one"]}),
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([{"prompt": "one plus one"}] * 4)
    assert batch["tool_mask"].tolist() == MASKS
    batch["advantages"] = torch.tensor([1.0, 0.2, 0.5, 0.3])  # a non-zero signal to compare losses by
    with torch.no_grad():
        masked = float(trainer.compute_loss(trainer.model, batch))
        cut = {k: v for k, v in batch.items() if k != "tool_mask"}
        cut["completion_mask"] = batch["completion_mask"] * batch["tool_mask"]
        assert math.isclose(masked, float(trainer.compute_loss(trainer.model, cut)), rel_tol=1e-5)
        kept = {k: v for k, v in batch.items() if k != "tool_mask"}
        assert not math.isclose(masked, float(trainer.compute_loss(trainer.model, kept)), rel_tol=1e-3)
