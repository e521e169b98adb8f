"""Local judges (``judge:<name>``) through the model registry: the verdict formula against transformers run
by hand, batching and shared prefixes exact, group mode, discrimination by the trained tiny judge, hostile
input (huge completions, missing metadata) and loading errors naming the field."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import Message, Sample
from reward_service.judges.template import JudgeTemplate, numbered
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec
from tiny_models.judge import GROUP_TEMPLATE, POINTWISE_TEMPLATE, VERDICT_PROBABILITY

PROMPT = (Message("system", "Be brief."), Message("user", "What is 3 + 4?"))
# What tiny_models/judge.py guarantees on every pointwise question of its task, less the float noise
# between the builder's batching and the registry's.
BOXED_AT_LEAST = VERDICT_PROBABILITY - 1e-4
PLAIN_AT_MOST = 1 - VERDICT_PROBABILITY + 1e-4
COMPLETIONS = [
    "The answer is \\boxed{7}.",
    "The answer is 7.",
    "3 + 4 = \\boxed{9}",
    "First, add 3 and 4. The answer is 7.",
]


def _samples(completions=COMPLETIONS, group="g", **metadata) -> list[Sample]:
    return [
        Sample(id=str(i), prompt=PROMPT, completion=c, metadata={"answer": "7", **metadata}, group=group)
        for i, c in enumerate(completions)
    ]


def _spec(path, **overrides) -> ModelSpec:
    fields = {"judge_template": POINTWISE_TEMPLATE, "judge_group_template": GROUP_TEMPLATE, **overrides}
    return ModelSpec(name="judge", path=str(path), kind=ModelKind.JUDGE, **fields)


def _by_hand(path, texts: list[str]) -> list[float]:
    """p(Yes) / (p(Yes) + p(No)) of the first answer token, one unpadded forward per text."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    yes, no = tokenizer.convert_tokens_to_ids(["Yes", "No"])
    values = []
    for text in texts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(chat, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            probs = model(input_ids=ids).logits[0, -1].softmax(-1)
        values.append(float(probs[yes] / (probs[yes] + probs[no])))
    return values


@pytest.fixture
async def registry(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=20, min_shared_prefix_tokens=4))
    await registry.load(_spec(tiny_models["judge"]))
    yield registry
    await registry.close()


async def test_pointwise_is_the_verdict_probability_and_discriminates(registry, tiny_models):
    results = await registry.score("judge:judge", _samples(), {})
    template = JudgeTemplate.parse(POINTWISE_TEMPLATE, kind="pointwise")
    expected = _by_hand(
        tiny_models["judge"], [template.fill({"answer": "7", "completion": c}) for c in COMPLETIONS]
    )
    assert [r.value for r in results] == pytest.approx(expected, abs=1e-5)
    assert all(r.error == "" and 0 <= r.value <= 1 for r in results)
    # The tiny judge was trained to say Yes to a boxed final answer.
    boxed = [r.value for r, c in zip(results, COMPLETIONS, strict=True) if "boxed" in c]
    plain = [r.value for r, c in zip(results, COMPLETIONS, strict=True) if "boxed" not in c]
    assert min(boxed) >= BOXED_AT_LEAST and max(plain) <= PLAIN_AT_MOST


async def test_concurrent_requests_batch_and_share_the_prompt(registry):
    alone = [(await registry.score("judge:judge", [s], {}))[0].value for s in _samples()]
    before = registry.batcher_stats("judge")
    together = await asyncio.gather(*(registry.score("judge:judge", _samples(), {}) for _ in range(4)))
    after = registry.batcher_stats("judge")
    for results in together:
        assert [r.value for r in results] == pytest.approx(alone, abs=1e-5)
    assert after["forward_calls"] - before["forward_calls"] < 4  # four requests, fewer forwards
    assert after["prefix_tokens"] > before["prefix_tokens"]  # the shared template head ran once per request


async def test_group_mode_shows_every_completion(registry, tiny_models):
    results = await registry.score("judge:judge", _samples(), {"mode": "group"})
    template = JudgeTemplate.parse(GROUP_TEMPLATE, kind="group")
    texts = [
        template.fill({"answer": "7", "completions": numbered(COMPLETIONS), "index": str(k)})
        for k in range(1, len(COMPLETIONS) + 1)
    ]
    assert [r.value for r in results] == pytest.approx(_by_hand(tiny_models["judge"], texts), abs=1e-5)
    # Two groups in one request are judged apart: the same completions give the same values.
    mixed = _samples(group="a")[:2] + _samples(group="b")[:2]
    two = await registry.score("judge:judge", mixed, {"mode": "group"})
    pair = await registry.score("judge:judge", _samples()[:2], {"mode": "group"})
    assert [r.value for r in two] == pytest.approx([r.value for r in pair] * 2, abs=1e-5)


async def test_huge_completion_is_cut_to_the_context_with_a_marker(registry):
    huge = "The answer is 7. " * 20_000
    engine = registry._current("judge:judge").engine
    for mode in ("pointwise", "group"):
        results = await registry.score(
            "judge:judge", _samples([huge, "The answer is \\boxed{7}."]), {"mode": mode}
        )
        assert all(r.error == "" and 0 <= r.value <= 1 for r in results)
    encoded = engine.encode(_samples([huge])[0])
    assert encoded.num_tokens <= engine.loaded.max_positions
    assert "of this response cut to fit the judge's context" in engine.loaded.tokenizer.decode(
        encoded.input_ids
    )


async def test_missing_metadata_is_a_component_error_naming_it(registry):
    samples = [Sample(id="x", prompt=PROMPT, completion="7"), *_samples()[:1]]
    for mode in ("pointwise", "group"):
        results = await registry.score("judge:judge", samples, {"mode": mode})
        assert results[0].value is None and "metadata 'answer' is required" in results[0].error
    pointwise = await registry.score("judge:judge", samples, {})
    assert pointwise[1].error == "" and pointwise[1].value is not None


async def test_params_and_description(registry):
    with pytest.raises(InvalidArgument) as caught:
        registry.validate_params("judge:judge", {"mode": "pairwise"})
    assert caught.value.field == "params.mode"
    (description,) = registry.describe()
    assert description.name == "judge:judge" and description.required_metadata == ("answer",)
    assert "p(Yes) / (p(Yes) + p(No))" in description.description


async def test_hot_swap_replaces_the_judge(registry, tiny_models):
    first = await registry.score("judge:judge", _samples(), {})
    # Swapped for the untrained policy read at '+'/'-': the version grows and the values change.
    info = await registry.load(
        ModelSpec(
            name="judge",
            path=str(tiny_models["policy"]),
            kind=ModelKind.JUDGE,
            positive_token="+",
            negative_token="-",
        )
    )
    assert info.version == 2
    second = await registry.score("judge:judge", _samples(), {})
    assert [r.value for r in second] != pytest.approx([r.value for r in first], abs=1e-3)


@pytest.mark.parametrize(
    ("overrides", "model", "field"),
    [
        ({"judge_template": "{completion.x}"}, "judge", "judge_template"),
        ({"judge_group_template": "{completions}"}, "judge", "judge_group_template"),
        ({"positive_token": "Yes please"}, "judge", "positive_token"),
        ({"negative_token": "Yes"}, "judge", "negative_token"),
        ({}, "orm", "kind"),
    ],
)
async def test_load_errors_name_the_field(tiny_models, overrides, model, field):
    registry = ModelRegistry(ModelSettings())
    try:
        with pytest.raises(InvalidArgument) as caught:
            await registry.load(_spec(tiny_models[model], **overrides))
        assert caught.value.field == field
    finally:
        await registry.close()


async def test_remote_judge_names_are_reserved(tiny_models):
    registry = ModelRegistry(ModelSettings(), reserved=frozenset({"judge:judge"}))
    with pytest.raises(InvalidArgument, match="remote judge") as caught:
        await registry.load(_spec(tiny_models["judge"]))
    assert caught.value.field == "name"


async def test_swap_while_requests_are_in_flight(registry, tiny_models):
    """Requests racing a swap each see one whole judge (the old or the new), none fails."""
    samples = _samples()
    old = [r.value for r in await registry.score("judge:judge", samples, {})]
    new_spec = ModelSpec(
        name="judge",
        path=str(tiny_models["policy"]),
        kind=ModelKind.JUDGE,
        positive_token="+",
        negative_token="-",
    )
    requests = [asyncio.ensure_future(registry.score("judge:judge", samples, {})) for _ in range(6)]
    swap = asyncio.ensure_future(registry.load(new_spec))
    later = [asyncio.ensure_future(registry.score("judge:judge", samples, {})) for _ in range(6)]
    await swap
    new = [r.value for r in await registry.score("judge:judge", samples, {})]
    for results in await asyncio.gather(*requests, *later):
        values = [r.value for r in results]
        assert values == pytest.approx(old, abs=1e-5) or values == pytest.approx(new, abs=1e-5)


async def test_preloaded_judge_and_its_errors(tiny_models):
    entry = {
        "name": "pre",
        "path": str(tiny_models["judge"]),
        "kind": "judge",
        "judge_template": POINTWISE_TEMPLATE,
    }
    registry = ModelRegistry(ModelSettings.model_validate({"preload": [entry]}))
    try:
        await registry.start()
        (result,) = await registry.score("judge:pre", _samples()[:1], {})
        assert result.value >= BOXED_AT_LEAST
    finally:
        await registry.close()
    bad = ModelRegistry(ModelSettings.model_validate({"preload": [{**entry, "judge_template": "{answer}"}]}))
    with pytest.raises(InvalidArgument) as caught:
        await bad.start()
    assert caught.value.field == "models.preload[0].judge_template"
