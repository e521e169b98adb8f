"""The variant GRPOTrainer subclasses against TRL's own `_compute_loss` on a real tiny trainer.

Every trainer here is a real `trl.GRPOTrainer` (or subclass) built on the tiny Qwen2 policy; the loss
inputs are the keys TRL's `_generate_and_score_completions` returns, fabricated from fixed random tensors so
each case can switch on the terms it exercises (old, reference and sampler log-probs, IS ratio, tool mask).
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from grpo_runtime.config import ConfigError
from tests.unit.trainer.fixtures import length_reward, offset_rollout
from trainer_service.config.variants import (
    VARIANTS,
    grpo_config_overrides,
    normalize_variant,
    validate_variant_params,
)
from trainer_service.training import losses
from trainer_service.training.variant_loss import REQUIRED_INPUT_KEYS, MissingLossInputError
from trainer_service.training.variant_trainer import make_variant_trainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TRL_NATIVE = [name for name, spec in losses.VARIANT_SPECS.items() if spec.trl_native]
EXTRA = [name for name, spec in losses.VARIANT_SPECS.items() if not spec.trl_native]
B, P, T = 4, 5, 8


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return Dataset.from_dict(
        {"prompt": ["one plus one", "hello there", "count to three", "name a colour"] * 2}
    )


@pytest.fixture
def build(policy_dir, tokenizer, dataset, tmp_path):
    """build(trainer_cls, **GRPOConfig overrides) → a trainer on a fresh copy of the tiny policy."""

    def _build(cls: type, **config: Any):
        base = {
            "output_dir": str(tmp_path / "out"),
            "use_cpu": True,
            "report_to": [],
            "per_device_train_batch_size": B,
            "num_generations": 4,
            "max_completion_length": T,
            "bf16": False,
            "gradient_checkpointing": False,
            "save_strategy": "no",
            "logging_steps": 1,
            "generation_kwargs": {"min_new_tokens": 1},
        }
        base.update(config)
        model = AutoModelForCausalLM.from_pretrained(policy_dir)
        return cls(
            model=model,
            args=GRPOConfig(**base),
            reward_funcs=length_reward,
            train_dataset=dataset,
            processing_class=tokenizer,
        )

    return _build


def fabricate_inputs(model, *, seed: int = 0, drift: float = 0.4) -> dict[str, Any]:
    """A batch with every key `_generate_and_score_completions` can return, from fixed random tensors.

    Prompts are left-padded and completions right-padded (as TRL pads them). old/ref/sampler log-probs are the
    model's own log-probs plus up to ±`drift` nats of noise, so ratios leave the clip range and masks bite.
    """
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(3, vocab, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_mask[3, :1] = 0
    completion_ids = torch.randint(3, vocab, (B, T), generator=g)
    completion_mask = torch.ones(B, T, dtype=torch.long)
    for i, length in enumerate([8, 5, 3, 7]):
        completion_mask[i, length:] = 0
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([prompt_ids, completion_ids], 1),
            attention_mask=torch.cat([prompt_mask, completion_mask], 1),
        ).logits[:, P - 1 : -1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None])[..., 0]

    def noisy() -> torch.Tensor:
        return logps + (torch.rand(B, T, generator=g) * 2 - 1) * drift

    tool_mask = torch.ones(B, T, dtype=torch.long)
    tool_mask[0, 2:4] = 0
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.1, -0.6, 0.3, -0.8]),
        "num_items_in_batch": completion_mask.sum() * 2,  # the generation batch is two micro-batches
        "old_per_token_logps": noisy(),
        "ref_per_token_logps": noisy(),
        "sampling_per_token_logps": noisy(),
        "importance_sampling_ratio": 0.6 + torch.rand(B, T, generator=g) * 0.8,
        "tool_mask": tool_mask,
        "gpg_alpha": torch.tensor(4 / 3),  # GPG's α of the generation batch this micro-batch came from
    }


def loss_and_grads(trainer, cls: type, inputs: dict[str, Any], *, train: bool, accumulation: int):
    """`cls._compute_loss` on `trainer` (TRL's or ours), its loss, parameter gradients and logged metrics."""
    trainer.model.train(train)
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    trainer._metrics["eval"].clear()
    loss = cls._compute_loss(trainer, trainer.model, inputs)
    loss.backward()
    grads = {
        name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None
    }
    mode = "train" if train else "eval"
    return loss.detach(), grads, {k: list(v) for k, v in trainer._metrics[mode].items()}


# Scenarios: (GRPOConfig extras, trainer attributes, input keys to drop, train mode, GA steps)
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...], bool, int]] = {
    "off_policy": ({}, {}, ("ref_per_token_logps", "importance_sampling_ratio", "tool_mask"), True, 1),
    "kl_rollout_is_accumulation": (
        {"beta": 0.05, "gradient_accumulation_steps": 2, "epsilon_high": 0.28},
        {"use_vllm": True, "vllm_importance_sampling_correction": True},
        (),
        True,
        2,
    ),
    "masks_entropy_bonus": (
        {
            "off_policy_mask_threshold": 0.02,
            "top_entropy_quantile": 0.5,
            "entropy_coef": 0.01,
            "use_bias_correction_kl": False,
            "beta": 0.02,
        },
        {},
        ("importance_sampling_ratio",),
        True,
        1,
    ),
    "eval_on_policy": (
        {},
        {},
        ("old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio"),
        False,
        1,
    ),
}


def variant_config(variant: str, scenario: str) -> dict[str, Any]:
    extras = dict(SCENARIOS[scenario][0])
    delta = None
    if losses.VARIANT_SPECS[variant].delta_role == "cap" and scenario == "off_policy":
        delta = 1.3  # INTELLECT-2 cap: bites for A < 0 tokens whose ratio exceeds 1.3
    if variant == "cispo":
        extras["epsilon_high"] = 1.15
    overrides = grpo_config_overrides(
        variant,
        grpo_delta=delta,
        epsilon_high=extras.pop("epsilon_high", None),
        params={"sapo_temperature_neg": 1.3} if variant == "sapo" else None,
    )
    return {**extras, **overrides}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("variant", TRL_NATIVE)
def test_loss_gradient_and_metrics_equal_trl(build, variant, scenario):
    config = variant_config(variant, scenario)
    _, attributes, drop, train, accumulation = SCENARIOS[scenario]
    stock = build(GRPOTrainer, **config)
    ours_cls = make_variant_trainer(variant)
    ours = build(ours_cls, **config)
    for trainer in (stock, ours):
        for key, value in attributes.items():
            setattr(trainer, key, value)
    inputs = {k: v for k, v in fabricate_inputs(stock.model).items() if k not in drop}

    stock_loss, stock_grads, stock_metrics = loss_and_grads(
        stock, GRPOTrainer, inputs, train=train, accumulation=accumulation
    )
    our_loss, our_grads, our_metrics = loss_and_grads(
        ours, ours_cls, inputs, train=train, accumulation=accumulation
    )

    assert stock_loss.item() != 0.0
    torch.testing.assert_close(our_loss, stock_loss, atol=1e-6, rtol=0)
    assert our_grads.keys() == stock_grads.keys() and stock_grads
    for name, grad in stock_grads.items():
        torch.testing.assert_close(
            our_grads[name], grad, atol=1e-6, rtol=0, msg=f"{variant}/{scenario}: {name}"
        )
    assert our_metrics.keys() == stock_metrics.keys()
    for key, values in stock_metrics.items():
        assert our_metrics[key] == pytest.approx(values, abs=1e-6), key


def test_scenarios_exercise_clipping_cap_and_masks(build):
    """Guard the parity cases against being vacuous: the fabricated batch really clips, caps and masks."""
    trainer = build(GRPOTrainer)
    inputs = fabricate_inputs(trainer.model)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            T,
            compute_entropy=True,
        )
    mask = inputs["completion_mask"].bool()
    ratio = torch.exp(logps - inputs["old_per_token_logps"])
    negative = (inputs["advantages"] < 0)[:, None] & mask
    positive = (inputs["advantages"] > 0)[:, None] & mask
    assert (ratio[negative] > 1.3).any(), "the δ = 1.3 cap never bites"
    assert (ratio[negative] < 0.8).any() and (ratio[positive] > 1.2).any(), "the clip never bites"
    keep = losses.off_policy_sequence_mask(
        inputs["advantages"], logps, inputs["sampling_per_token_logps"], inputs["completion_mask"], 0.02
    )
    assert 0 < keep.sum() < B


def independent_logps(model, inputs: dict[str, Any]) -> torch.Tensor:
    """ℓ_θ (B, T) with grad, from a plain forward pass (no TRL code)."""
    logits = model(
        input_ids=torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
    ).logits[:, inputs["prompt_ids"].size(1) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]


def extra_formula(variant: str, logps, inputs, delta: float, num_tokens: float) -> torch.Tensor:
    """The extra variants' losses written out from their papers / soup-cli's GRPO trainer, on tensors."""
    m = inputs["completion_mask"].float()
    a = inputs["advantages"][:, None]
    old = inputs["old_per_token_logps"]
    if variant == "two_sided":
        r = torch.exp(logps - old)
        per_token = -torch.minimum(r * a, torch.clamp(r, 1 - delta, 1 + delta) * a)
        return (per_token * m).sum() / num_tokens
    if variant == "rft":
        positive = (a > 0).float() * m
        return -(logps * positive).sum() / positive.sum()
    if variant == "gpg":
        alpha = float(inputs["gpg_alpha"])
        return -(alpha * a * logps * m).sum() / num_tokens
    raise AssertionError(variant)


@pytest.mark.parametrize("variant", EXTRA)
def test_extra_variant_loss_and_gradient_equal_formula(build, variant):
    delta = 0.15
    trainer_cls = make_variant_trainer(variant)
    trainer = build(
        trainer_cls, **grpo_config_overrides(variant, grpo_delta=delta if variant == "two_sided" else None)
    )
    inputs = {
        k: v
        for k, v in fabricate_inputs(trainer.model).items()
        if k not in ("ref_per_token_logps", "importance_sampling_ratio", "tool_mask")
    }
    loss, grads, metrics = loss_and_grads(trainer, trainer_cls, inputs, train=True, accumulation=1)

    trainer.model.zero_grad(set_to_none=True)
    expected = extra_formula(
        variant, independent_logps(trainer.model, inputs), inputs, delta, float(inputs["num_items_in_batch"])
    )
    expected.backward()
    torch.testing.assert_close(loss, expected.detach(), atol=1e-6, rtol=0)
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=0, msg=name)
    assert "entropy" in metrics
    if variant == "two_sided":
        assert metrics["clip_ratio/region_mean"][0] > 0  # δ = 0.15 clips this batch
    if variant == "rft":
        positive_share = float(inputs["completion_mask"][[0, 2]].sum() / inputs["completion_mask"].sum())
        assert metrics["rft/positive_token_fraction"][0] == pytest.approx(positive_share)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "dapo"])
def test_selected_variant_changes_the_gradient_of_the_default_trainer(build, variant):
    """soup-cli's bug (every variant silently trained TRL's default loss) cannot come back: each variant's
    gradient differs from stock GRPOTrainer with the default loss_type on the same batch."""
    assert GRPOConfig(output_dir="unused", use_cpu=True, bf16=False).loss_type == "dapo"
    stock = build(GRPOTrainer)
    config = grpo_config_overrides(
        variant,
        grpo_delta=0.1 if variant == "two_sided" else None,
        epsilon_high=5.0 if variant == "cispo" else None,
    )
    ours_cls = make_variant_trainer(variant)
    ours = build(ours_cls, **config)
    inputs = {k: v for k, v in fabricate_inputs(stock.model).items() if k != "importance_sampling_ratio"}
    _, stock_grads, _ = loss_and_grads(stock, GRPOTrainer, inputs, train=True, accumulation=1)
    _, our_grads, _ = loss_and_grads(ours, ours_cls, inputs, train=True, accumulation=1)
    difference = max((our_grads[n] - g).abs().max().item() for n, g in stock_grads.items())
    assert difference > 1e-4, f"{variant} trains the same gradient as TRL's default loss"
    assert sum(g.abs().sum().item() for g in our_grads.values()) > 0


@pytest.mark.parametrize("key", REQUIRED_INPUT_KEYS)
def test_missing_required_input_raises_naming_it(build, key):
    cls = make_variant_trainer("two_sided")
    trainer = build(cls, **grpo_config_overrides("two_sided", grpo_delta=0.2))
    inputs = fabricate_inputs(trainer.model)
    del inputs[key]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    with pytest.raises(MissingLossInputError, match=rf"inputs\['{key}'\]") as raised:
        trainer.compute_loss(trainer.model, inputs)
    assert raised.value.key == key
    assert isinstance(raised.value, KeyError)


@pytest.mark.parametrize(
    ("variant", "config", "attributes", "key"),
    [
        ("dapo", {}, {}, "num_items_in_batch"),
        ("grpo", {"beta": 0.1}, {}, "ref_per_token_logps"),
        (
            "sapo",
            {},
            {"use_vllm": True, "vllm_importance_sampling_correction": True},
            "importance_sampling_ratio",
        ),
    ],
)
def test_conditionally_required_input_raises_naming_it(build, variant, config, attributes, key):
    cls = make_variant_trainer(variant)
    trainer = build(cls, **config, **grpo_config_overrides(variant))
    for name, value in attributes.items():
        setattr(trainer, name, value)
    inputs = fabricate_inputs(trainer.model)
    del inputs[key]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    with pytest.raises(MissingLossInputError, match=key):
        trainer.compute_loss(trainer.model, inputs)


def test_config_that_contradicts_the_variant_is_rejected_naming_the_field(build):
    with pytest.raises(ConfigError, match=r"GRPOConfig\.loss_type"):
        build(make_variant_trainer("gspo"))  # default loss_type dapo
    with pytest.raises(ConfigError, match=r"GRPOConfig\.importance_sampling_level"):
        build(make_variant_trainer("gspo"), loss_type="grpo")
    with pytest.raises(ConfigError, match=r"GRPOConfig\.delta"):
        build(make_variant_trainer("two_sided"))  # no δ
    with pytest.raises(ConfigError, match=r"GRPOConfig\.delta"):
        build(make_variant_trainer("dapo"), delta=0.5)  # a cap below 1 + ε


def test_factory_caches_one_class_per_variant_and_base():
    gspo = make_variant_trainer("gspo")
    assert make_variant_trainer(" GSPO ") is gspo
    assert make_variant_trainer("standard") is make_variant_trainer("dapo")
    assert issubclass(gspo, GRPOTrainer) and gspo.grpo_variant == "gspo"

    class MyTrainer(GRPOTrainer):
        pass

    mine = make_variant_trainer("gspo", base=MyTrainer)
    assert mine is not gspo and issubclass(mine, MyTrainer)
    with pytest.raises(TypeError, match="GRPOTrainer"):
        make_variant_trainer("gspo", base=dict)
    with pytest.raises(ConfigError, match="variant: unknown variant"):
        make_variant_trainer("ppo")


def test_config_overrides_per_variant():
    assert grpo_config_overrides("gspo") == {
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "delta": None,
        "epsilon": 0.2,
        "epsilon_high": None,
    }
    assert grpo_config_overrides("luspo")["importance_sampling_level"] == "sequence"
    assert grpo_config_overrides("dapo", grpo_delta=4.0, epsilon_high=0.28)["delta"] == 4.0
    two_sided = grpo_config_overrides("two_sided", grpo_delta=0.2)
    assert (two_sided["loss_type"], two_sided["delta"]) == ("dapo", 0.2)
    assert grpo_config_overrides("vespo", params={"vespo_k_pos": 1.5})["vespo_k_pos"] == 1.5
    for name in VARIANTS:
        config = grpo_config_overrides(
            name,
            grpo_delta=0.3 if name == "two_sided" else None,
            epsilon_high=5.0 if name == "cispo" else None,
        )
        GRPOConfig(output_dir="unused", use_cpu=True, bf16=False, **config)  # TRL accepts every combination


@pytest.mark.parametrize(
    ("variant", "kwargs", "key"),
    [
        ("two_sided", {}, "delta"),
        ("two_sided", {"grpo_delta": 1.5}, "delta"),
        ("two_sided", {"grpo_delta": float("nan")}, "delta"),
        ("grpo", {"grpo_delta": 1.1}, "delta"),
        ("cispo", {"grpo_delta": 5.0}, "delta"),
        ("cispo", {}, "epsilon_high"),  # unset = ε = 0.2: would only scale the gradient down
        ("cispo", {"epsilon_high": 1.0}, "epsilon_high"),
        ("rft", {"grpo_delta": 0.2}, "delta"),
        ("grpo", {"epsilon": -0.1}, "epsilon"),
        ("dapo", {"epsilon_high": 0.0}, "epsilon_high"),
        ("sapo", {"params": {"vespo_k_pos": 2.0}}, "params.vespo_k_pos"),
        ("sapo", {"params": {"sapo_temperature_pos": 0.0}}, "params.sapo_temperature_pos"),
        ("vespo", {"params": {"vespo_lambda_neg": True}}, "params.vespo_lambda_neg"),
        ("nope", {}, "variant"),
    ],
)
def test_bad_variant_params_name_the_key(variant, kwargs, key):
    with pytest.raises(ConfigError) as raised:
        validate_variant_params(variant, **kwargs)
    assert raised.value.key == key
    assert str(raised.value).startswith(f"{key}: ")


def test_variant_names_are_normalised():
    assert normalize_variant("Two_Sided") == "two_sided"
    assert normalize_variant("standard") == "dapo"
    assert set(VARIANTS) == set(losses.VARIANT_SPECS)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["two_sided", "gspo"])
def test_two_real_train_steps_with_trl_generation(build, variant):
    cls = make_variant_trainer(variant)
    trainer = build(
        cls,
        max_steps=2,
        learning_rate=1e-2,
        **grpo_config_overrides(variant, grpo_delta=0.2 if variant == "two_sided" else None),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    result = trainer.train()
    assert trainer.state.global_step == 2
    assert torch.isfinite(torch.tensor(result.training_loss))
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter moved after two optimizer steps"
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all("clip_ratio/region_mean" in entry for entry in logged)


@pytest.mark.parametrize("correction", [True, False])
def test_rollout_func_batches_get_the_sampler_importance_ratio(
    policy_dir, tokenizer, dataset, tmp_path, correction
):
    cls = make_variant_trainer("grpo")
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=B,
        num_generations=4,
        max_completion_length=T,
        vllm_importance_sampling_correction=correction,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=3.0,
        **grpo_config_overrides("grpo"),
    )
    trainer = cls(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        args=args,
        reward_funcs=length_reward,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=offset_rollout(tokenizer, offset=0.05),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([{"prompt": "one plus one"}] * B)
    # TRL leaves π_θold out (the batch trains before the next optimizer step), and so does this trainer: the
    # loss's own forward is π_θold, so the ratio is computed there, with no extra forward.
    assert "importance_sampling_ratio" not in batch and "old_per_token_logps" not in batch
    if not correction:
        return

    def grad_norm(inputs) -> torch.Tensor:
        trainer.model.zero_grad(set_to_none=True)
        trainer.compute_loss(trainer.model, inputs).backward()
        return torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in trainer.model.parameters() if p.grad is not None])
        )

    deferred = grad_norm(batch)
    # token_truncate: ρ = clamp(exp(ℓ_old − ℓ_sampler), max=3) = e^−0.05 on every completion token
    assert trainer._metrics["train"]["sampling/importance_sampling_ratio/mean"][0] == pytest.approx(
        math.exp(-0.05), abs=1e-5
    )
    assert trainer._metrics["train"]["sampling/sampling_logp_difference/max"][0] == pytest.approx(
        0.05, abs=1e-5
    )
    # The gradient has that ratio applied, as when the batch carries it: e^−0.05 × the uncorrected one.
    unit = grad_norm({**batch, "importance_sampling_ratio": torch.ones(B, 5)})
    assert float(deferred / unit) == pytest.approx(math.exp(-0.05), rel=1e-4)
    # Without the sampler log-probs it cannot be computed: an error, not a silent uncorrected loss.
    without = {k: v for k, v in batch.items() if k != "sampling_per_token_logps"}
    with pytest.raises(MissingLossInputError, match="sampling_per_token_logps"):
        trainer.compute_loss(trainer.model, without)


def test_vespo_with_a_rollout_func_needs_a_token_level_sampler_ratio(
    policy_dir, tokenizer, dataset, tmp_path
):
    overrides = grpo_config_overrides("vespo")
    assert overrides["vllm_importance_sampling_mode"] == "token_truncate"
    overrides["vllm_importance_sampling_mode"] = "sequence_mask"
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=B,
        num_generations=4,
        **overrides,
    )
    with pytest.raises(ConfigError, match=r"GRPOConfig\.vllm_importance_sampling_mode"):
        make_variant_trainer("vespo")(
            model=AutoModelForCausalLM.from_pretrained(policy_dir),
            args=args,
            reward_funcs=length_reward,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=offset_rollout(tokenizer, offset=0.0),
        )
