"""The HF engine keeps an episode's KV cache between turns: the next turn computes only its new tokens, and
samples exactly what recomputing the whole prefix samples."""

from __future__ import annotations

import pytest

from rollout_service.engines.hf import HFEngine
from rollout_service.types import FinishReason, GenerationJob, SamplingSpec

GREEDY = SamplingSpec(temperature=0.0, max_tokens=8)
TOOL_TOKENS = [1, 40, 41, 42, 2, 1, 43]  # stands for a tool message the loop appended


@pytest.fixture(scope="module")
def engine(tiny_models):
    return HFEngine(str(tiny_models["policy"]))


def turn(engine, prompt, session=None, sampling=GREEDY):
    job = GenerationJob([list(prompt)], 1, sampling, session=session)
    engine.generate([job])
    return job.results[0]


def test_second_turn_reuses_the_first_turns_kv_and_samples_the_same(engine):
    prompt = [1, 405, 202, 505, 307, 224, 20, 21]
    first = turn(engine, prompt, session="a")
    assert first.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    second_prompt = prompt + first.token_ids + TOOL_TOKENS
    before = engine.prefill_tokens, engine.reused_tokens
    reused = turn(engine, second_prompt, session="a")
    computed = engine.prefill_tokens - before[0]
    # Only the first turn's last token (sampled, never fed) and the tool tokens are computed.
    assert computed == 1 + len(TOOL_TOKENS)
    assert engine.reused_tokens - before[1] == len(second_prompt) - computed
    before = engine.prefill_tokens
    recomputed = turn(engine, second_prompt)
    assert engine.prefill_tokens - before == len(second_prompt)
    assert reused.token_ids == recomputed.token_ids
    assert reused.logprobs == pytest.approx(recomputed.logprobs, abs=1e-4)
    engine.release_session("a")


def test_a_batch_mixes_cached_rows_of_different_lengths_with_uncached_ones(engine):
    prompts = {"short": [1, 405, 202], "long": [1, 405, 202, 505, 307, 224, 20, 21, 22, 23, 24]}
    grown = {}
    for name, prompt in prompts.items():
        first = turn(engine, prompt, session=name)
        grown[name] = prompt + first.token_ids + TOOL_TOKENS[: 2 + len(name)]
    fresh = [5, 6, 7, 8, 9]
    jobs = [GenerationJob([grown[name]], 1, GREEDY, session=name) for name in grown]
    jobs.append(GenerationJob([fresh], 1, GREEDY))
    engine.generate(jobs)
    for job in jobs:
        alone = turn(engine, job.prompt_token_ids[0])
        assert job.results[0].token_ids == alone.token_ids
        assert job.results[0].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    for name in grown:
        engine.release_session(name)


def test_a_prompt_that_does_not_extend_the_cache_is_computed_in_full(engine):
    first = turn(engine, [1, 405, 202, 505], session="b")
    before = engine.prefill_tokens
    other = [1, 406, 202, 505, 307]  # differs inside the cached prefix
    assert turn(engine, other, session="b").token_ids == turn(engine, other).token_ids
    assert engine.prefill_tokens - before == 2 * len(other)
    engine.release_session("b")
    assert first.token_ids


def test_sleep_drops_every_kept_cache(engine):
    """KV computed by weights that may change before the next turn is not reused (the same holds for a weight
    update)."""
    prompt = [1, 405, 202]
    first = turn(engine, prompt, session="c")
    engine.sleep(1)
    engine.wake_up({"weights", "kv_cache"})
    grown = prompt + first.token_ids + TOOL_TOKENS
    before = engine.prefill_tokens
    turn(engine, grown, session="c")
    assert engine.prefill_tokens - before == len(grown)
    engine.release_session("c")
