"""PRM step scores against values computed here, independently, from the tiny models' logits."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import Message, Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec, PrmFormat

QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTION = "Compute 3 * 4 - 5."
COMPLETIONS = [
    "Step 1: 3 * 4 = 12.\n\nStep 2: 12 - 5 = 7.\n\nThe answer is \\boxed{7}.",
    "The answer is 19.",
    "  First, read the question.  \n\n\n\nNext, check it.\n\n",
]


def _samples() -> list[Sample]:
    prompt = (Message("system", "You are terse."), Message("user", QUESTION))
    return [Sample(id=str(i), prompt=prompt, completion=c) for i, c in enumerate(COMPLETIONS)]


def _expected_token_classification(path) -> list[list[float]]:
    """Qwen2.5-Math-PRM model-card recipe, one unpadded sequence at a time."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForTokenClassification.from_pretrained(path).eval()
    sep_id = tokenizer.encode("<extra_0>", add_special_tokens=False)[0]
    expected = []
    for completion in COMPLETIONS:
        steps = [s.strip() for s in completion.split("\n\n") if s.strip()]
        messages = [
            {"role": "system", "content": QWEN_SYSTEM},
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]  # (T, 2)
        mask = ids[0] == sep_id
        assert int(mask.sum()) == len(steps)
        expected.append(torch.softmax(logits[mask], dim=-1)[:, 1].tolist())
    return expected


def _expected_step_tag(path) -> list[list[float]]:
    """Math-Shepherd recipe: f"{question} {steps}" with " ки" ending each step, P('+') vs P('-')."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    plus, minus = (tokenizer.encode(t, add_special_tokens=False)[-1] for t in ("+", "-"))
    tag_id = tokenizer.encode("ки", add_special_tokens=False)[-1]
    expected = []
    for completion in COMPLETIONS:
        steps = [s.strip() for s in completion.split("\n\n") if s.strip()]
        text = QUESTION + " " + "".join(f"{s} ки\n\n" for s in steps).removesuffix("\n\n")
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]  # (T, V)
        at_tags = logits[ids[0] == tag_id][:, [plus, minus]]
        assert at_tags.shape[0] == len(steps)
        expected.append(torch.softmax(at_tags, dim=-1)[:, 0].tolist())
    return expected


@pytest.fixture
async def registry(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=2))
    await registry.load(ModelSpec(name="token", path=str(tiny_models["prm-token"]), kind=ModelKind.PRM))
    await registry.load(ModelSpec(name="tag", path=str(tiny_models["prm-steptag"]), kind=ModelKind.PRM))
    yield registry
    await registry.close()


def test_format_detected_from_architecture(registry):
    formats = {info.name: info.prm_format for info in registry.list()}
    assert formats == {"tag": PrmFormat.STEP_TAG, "token": PrmFormat.TOKEN_CLASSIFICATION}


@pytest.mark.parametrize(
    ("reward_name", "model_key", "expected_fn"),
    [
        ("prm:token", "prm-token", _expected_token_classification),
        ("prm:tag", "prm-steptag", _expected_step_tag),
    ],
)
async def test_step_scores_match_independent_computation(
    registry, tiny_models, reward_name, model_key, expected_fn
):
    expected = expected_fn(tiny_models[model_key])
    # The samples are scored in one padded batch: right padding must not change any score.
    results = await registry.score(reward_name, _samples(), {})
    assert [len(r.step_scores) for r in results] == [3, 1, 2]
    for result, want in zip(results, expected, strict=True):
        assert result.error == ""
        assert result.step_scores == pytest.approx(want, abs=1e-5)
        assert result.value == pytest.approx(min(want), abs=1e-5)
        assert all(0.0 <= s <= 1.0 for s in result.step_scores)


@pytest.mark.parametrize(
    ("how", "reduce"),
    [
        ("min", min),
        ("prod", math.prod),
        ("last", lambda s: s[-1]),
        ("mean", lambda s: sum(s) / len(s)),
    ],
)
async def test_aggregates(registry, how, reduce):
    results = await registry.score("prm:token", _samples(), {"aggregate": how})
    for result in results:
        assert result.value == pytest.approx(reduce(result.step_scores), rel=1e-9)


@pytest.mark.parametrize("completion", ["", "   ", "\n\n\n\n", " \n\n \n\n"])
async def test_no_steps_is_an_error_not_a_zero(registry, completion):
    good, empty = await registry.score(
        "prm:token", [Sample(id="a", completion="One step."), Sample(id="b", completion=completion)], {}
    )
    assert good.value is not None and good.error == ""
    assert empty.value is None and empty.step_scores == []
    assert "no reasoning steps" in empty.error


async def test_too_long_input_names_the_limit_and_others_are_scored(registry):
    long_one = Sample(id="long", completion="\n\n".join(["3 * 4 = 12"] * 200))
    short, long = await registry.score("prm:tag", [Sample(id="s", completion="12 - 5 = 7"), long_one], {})
    assert short.value is not None
    assert long.value is None and "max_position_embeddings" in long.error and "512" in long.error


async def test_step_token_inside_a_step_is_reported(registry):
    (result,) = await registry.score("prm:token", [Sample(id="x", completion="a <extra_0> b\n\nc")], {})
    assert result.value is None and "step markers" in result.error


async def test_bad_params_are_invalid_argument(registry):
    with pytest.raises(InvalidArgument) as bad_value:
        await registry.score("prm:token", _samples(), {"aggregate": "max"})
    assert bad_value.value.field == "params.aggregate"
    with pytest.raises(InvalidArgument) as unknown:
        await registry.score("prm:token", _samples(), {"temperature": 1})
    assert unknown.value.field == "params.temperature"
    with pytest.raises(InvalidArgument) as wrong_kind:
        await registry.score("orm:token", _samples(), {})
    assert wrong_kind.value.field == "name"


def test_describe_lists_params_and_range(registry):
    described = {d.name: d for d in registry.describe()}
    assert set(described) == {"prm:tag", "prm:token"}
    token = described["prm:token"]
    assert (token.min_value, token.max_value) == (0.0, 1.0)
    (aggregate,) = token.params
    assert aggregate.name == "aggregate" and aggregate.default == "min"
    assert set(aggregate.choices) == {"min", "prod", "last", "mean"}
    assert registry.has("prm:token") and not registry.has("orm:token") and not registry.has("accuracy")
