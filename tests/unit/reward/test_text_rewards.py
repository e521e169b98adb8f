"""Text-only rewards against TRL's implementations and open-r1's formulas."""

from __future__ import annotations

import asyncio
import re

import pytest
from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment, think_format_reward

from reward_service.core.types import ComponentResult, Sample
from reward_service.rewards.accuracy import SoftOverlong
from reward_service.rewards.base import ThreadRunner
from reward_service.rewards.params import resolve_params
from reward_service.rewards.text import (
    RepetitionPenalty,
    format_value,
    reasoning_steps_value,
    tag_count_value,
    text_rewards,
)

TEXTS = [
    "<think>\nreason\n</think>\n<answer>\n42\n</answer>",
    "<think>\nreason\n</think>\n<answer>\n42\n</answer>\ntrailing",
    "<think>reason</think> answer",
    "<think>\nThis is my reasoning.\n</think>\nThis is my answer.",
    "<think>\nThis is my reasoning.\nThis is my answer.",
    "<think>a</think><think>b</think>",
    "no tags at all",
    "",
    "Step 1: do x\nStep 2: do y\n- bullet\n* star\nFinally, done",
    "1. first\n2. second",
    "First, a. Second, b.",
]


def _params(name: str, **given):
    reward = {r.description.name: r for r in text_rewards(ThreadRunner())}[name]
    return resolve_params(reward.description.params, given, "params")


def _r1_format(text: str) -> float:
    # open-r1 format_reward, written out from its source.
    pattern = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
    return 1.0 if re.match(pattern, text, re.DOTALL | re.MULTILINE) else 0.0


@pytest.mark.parametrize("text", TEXTS)
def test_format_matches_references(text):
    assert format_value(text, _params("format")) == _r1_format(text)
    trl = think_format_reward([[{"role": "assistant", "content": text}]])[0]
    assert format_value(text, _params("format", style="think")) == trl


def test_tag_count_and_reasoning_steps_formulas():
    assert tag_count_value(TEXTS[0], {}) == 1.0
    assert tag_count_value("<think>\n<think>\n", {}) == 0.0
    assert tag_count_value("<think>\nx\n</think>\n", {}) == 0.5
    assert reasoning_steps_value(TEXTS[8], _params("reasoning_steps")) == 1.0
    # "1." at the very start only (no MULTILINE in open-r1's pattern): 1 hit → 1/3.
    assert reasoning_steps_value(TEXTS[9], _params("reasoning_steps")) == pytest.approx(1 / 3)
    assert reasoning_steps_value(TEXTS[10], _params("reasoning_steps", min_steps=2)) == 1.0
    assert reasoning_steps_value("nothing", _params("reasoning_steps")) == 0.0


async def test_repetition_penalty_tokens_match_trl():
    ids = [[1, 2, 3, 4], [5, 5, 5, 5, 5], [1, 2], [1, 2, 1, 2, 1, 2, 3], []]
    samples = [Sample(id=str(i), completion="x" * len(c), completion_ids=tuple(c)) for i, c in enumerate(ids)]
    reward = RepetitionPenalty(ThreadRunner())
    for n, penalty in ((2, -1.0), (3, -0.5)):
        params = resolve_params(
            reward.description.params, {"unit": "tokens", "ngram_size": n, "max_penalty": penalty}, "p"
        )
        got = [c.value for c in await reward.score(samples, params)]
        assert got == pytest.approx(get_repetition_penalty_reward(n, penalty)(ids))
    assert get_repetition_penalty_reward(2, -1.0)(ids[:2]) == [0.0, -0.75]


async def test_repetition_penalty_words_open_r1():
    reward = RepetitionPenalty(ThreadRunner())
    params = resolve_params(reward.description.params, {}, "p")
    text = "the cat sat the cat sat the cat sat"
    words = text.lower().split()
    ngrams = list(zip(words, words[1:], words[2:], strict=False))
    expected = (1 - len(set(ngrams)) / len(ngrams)) * -1.0
    results = await reward.score([Sample(id="a", completion=text), Sample(id="b", completion="a b")], params)
    assert results[0].value == pytest.approx(expected)
    assert results[1].value == 0.0


async def test_repetition_penalty_chars_for_text_without_spaces():
    reward = RepetitionPenalty(ThreadRunner())
    params = resolve_params(reward.description.params, {"unit": "chars", "ngram_size": 2}, "p")
    texts = ["这个这个这个这个这个", "今天天气很好", "AbAb", "好"]
    results = await reward.score([Sample(id=str(i), completion=t) for i, t in enumerate(texts)], params)
    # 9 character bigrams, 2 distinct (这个, 个这); all 5 distinct; ab, ba, ab (lower-cased); too short.
    assert [r.value for r in results] == pytest.approx([-(1 - 2 / 9), 0.0, -(1 - 2 / 3), 0.0])
    words = resolve_params(reward.description.params, {"ngram_size": 2}, "p")
    assert (await reward.score([Sample(id="w", completion=texts[0])], words))[0].value == 0.0  # one "word"


def _open_r1_code_format(text: str, language: str) -> float:
    # open-r1 get_code_format_reward, written out from its source.
    pattern = rf"^<think>\n.*?\n</think>\n<answer>\n.*?```{language}.*?```.*?\n</answer>$"
    return 1.0 if re.match(pattern, text, re.DOTALL | re.MULTILINE) else 0.0


CODE_TEXTS = [
    "<think>\nplan\n</think>\n<answer>\n```python\nprint(1)\n```\n</answer>",
    "<think>\nplan\n</think>\n<answer>\nHere:\n```python\nprint(1)\n```\nDone.\n</answer>",
    "<think>\nplan\n</think>\n<answer>\n```cpp\nint main() {}\n```\n</answer>",
    "<think>\nplan\n</think>\n<answer>\nprint(1)\n</answer>",
    "```python\nprint(1)\n```",
    "<think>\nplan\n</think>\n<answer>\n```python\nprint(1)\n</answer>",
    "<think>plan</think><answer>```python\nprint(1)\n```</answer>",
]


@pytest.mark.parametrize("language", ["python", "cpp"])
async def test_code_format_matches_open_r1(language):
    reward = {r.description.name: r for r in text_rewards(ThreadRunner())}["code_format"]
    params = resolve_params(reward.description.params, {"language": language}, "p")
    results = await reward.score([Sample(id=str(i), completion=t) for i, t in enumerate(CODE_TEXTS)], params)
    assert [r.value for r in results] == [_open_r1_code_format(t, language) for t in CODE_TEXTS]
    assert {r.value for r in results} == {0.0, 1.0}


async def test_code_format_language_per_sample_is_data_not_a_pattern():
    reward = {r.description.name: r for r in text_rewards(ThreadRunner())}["code_format"]
    params = resolve_params(reward.description.params, {}, "p")
    fenced = "<think>\nx\n</think>\n<answer>\n```{}\ncode\n```\n</answer>"
    samples = [
        Sample(id="cpp", completion=fenced.format("cpp"), metadata={"language": "cpp"}),
        Sample(id="cpp-as-python", completion=fenced.format("cpp")),
        # open-r1 would compile "c++" as a pattern and fail; here it is the literal fence language.
        Sample(id="c++", completion=fenced.format("c++"), metadata={"language": "c++"}),
        Sample(id="dot", completion=fenced.format("px"), metadata={"language": "."}),
        Sample(id="bad", completion=fenced.format("cpp"), metadata={"language": 3}),
        Sample(id="long", completion=fenced.format("cpp"), metadata={"language": "c" * 65}),
    ]
    results = {s.id: r for s, r in zip(samples, await reward.score(samples, params), strict=True)}
    assert [results[k].value for k in ("cpp", "cpp-as-python", "c++", "dot")] == [1.0, 0.0, 1.0, 0.0]
    assert results["bad"].value is None and "language" in results["bad"].error
    assert results["long"].value is None and "64" in results["long"].error


async def test_soft_overlong_matches_trl():
    reward = SoftOverlong()
    params = resolve_params(
        reward.description.params, {"max_completion_len": 100, "soft_punish_cache": 20}, "p"
    )
    lengths = [0, 50, 80, 81, 90, 100, 101, 500]
    samples = [Sample(id="", completion="x", completion_ids=(1,) * n) for n in lengths]
    samples[0] = Sample(id="", completion="")
    got = [c.value for c in await reward.score(samples, params)]
    assert got == pytest.approx(get_soft_overlong_punishment(100, 20)([[1] * n for n in lengths]))
    assert got[4] == -0.5  # TRL's golden value
    missing = await reward.score([Sample(id="", completion="text but no ids")], params)
    assert missing[0].value is None and "completion_ids" in missing[0].error


# Quadratic for a backtracking engine on open-r1's format pattern.
FORMAT_BOMB = "<think>\n" + "\n</think>\n<answer>\n" * 60_000


async def test_a_sample_past_its_deadline_is_an_error_and_the_others_are_scored():
    runner = ThreadRunner(deadline_s=0.5, budget_s=30)
    reward = {r.description.name: r for r in text_rewards(runner)}["format"]
    samples = [Sample(id="ok", completion=TEXTS[0]), Sample(id="bomb", completion=FORMAT_BOMB)]
    results = await reward.score(samples, _params("format"))
    assert results[0].value == 1.0
    assert results[1].value is None
    assert results[1].error == "exceeded the per-sample deadline of 0.5s (text_deadline_s)"


async def test_the_request_budget_bounds_a_request_of_many_slow_samples():
    runner = ThreadRunner(deadline_s=0.3, budget_s=0.5)
    reward = {r.description.name: r for r in text_rewards(runner)}["format"]
    results = await reward.score(
        [Sample(id=str(i), completion=FORMAT_BOMB) for i in range(6)], _params("format")
    )
    assert len(results) == 6 and all(r.value is None for r in results)
    assert results[0].error.startswith("exceeded the per-sample deadline")
    assert results[-1].error == "exceeded the request's time budget of 0.5s (text_budget_s)"


async def test_a_cancelled_request_stops_its_thread_before_the_next_sample():
    runner = ThreadRunner(deadline_s=1.0, budget_s=60)
    calls: list[str] = []
    samples = [Sample(id=str(i), completion=FORMAT_BOMB) for i in range(20)]

    def one(sample: Sample, deadline) -> ComponentResult:
        calls.append(sample.id)
        return ComponentResult(value=format_value(sample.completion, {"style": "r1"}, deadline))

    task = asyncio.ensure_future(runner.map(samples, one))
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.sleep(2.5)
    assert len(calls) <= 2  # the sample in progress (and at most the next one), not all 20
