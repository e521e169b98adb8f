"""The HF engine keeps an episode's KV cache between turns: the next turn computes only its new tokens, and
samples exactly what recomputing the whole prefix samples. What it keeps stays within a byte budget, the
least recently used session's cache going first."""

from __future__ import annotations

import pytest
import torch

from rollout_service.engines.hf import HFEngine
from rollout_service.engines.registry import build_engine
from rollout_service.engines.session_caches import SessionCache, SessionCaches
from rollout_service.settings import RolloutSettings
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


def kv(tokens: int) -> SessionCache:
    """A cache of ``tokens`` positions, 16 bytes each (one layer, keys and values of 2 float32)."""
    return SessionCache(list(range(tokens)), [torch.zeros(1, tokens, 2)], [torch.zeros(1, tokens, 2)])


def test_kept_caches_stay_within_the_budget_least_recently_used_first():
    caches = SessionCaches(max_bytes=12 * 16)  # three caches of 4 tokens
    for session in "abc":
        caches.put(session, kv(4))
    assert caches.get("a") is not None  # now the most recently used
    caches.put("d", kv(4))
    assert (caches.sessions, caches.evicted) == ({"a", "c", "d"}, 1)
    caches.put("c", kv(8))  # replaces c's own cache; the oldest other one goes to make room
    assert (caches.sessions, caches.nbytes, caches.evicted) == ({"c", "d"}, 12 * 16, 2)
    caches.put("e", kv(16))  # larger than the whole budget: not kept, nothing else goes
    assert (caches.sessions, caches.evicted) == ({"c", "d"}, 3)
    caches.release("d")
    caches.release("unknown")
    assert (caches.sessions, caches.nbytes) == ({"c"}, 8 * 16)
    caches.clear()
    assert (caches.sessions, caches.nbytes) == (frozenset(), 0)


def test_a_cache_dropped_for_room_costs_a_whole_prefill_and_changes_no_token(engine, tiny_models):
    prompt = [1, 405, 202, 505, 307]
    turn(engine, prompt, session="probe")
    one_cache = engine.session_caches.nbytes
    engine.release_session("probe")
    settings = RolloutSettings(engine="hf", device="cpu", session_cache_bytes=one_cache)
    small = build_engine(str(tiny_models["policy"]), settings)
    first = turn(small, prompt, session="a")
    turn(small, prompt, session="b")
    assert (small.session_caches.sessions, small.session_caches.evicted) == ({"b"}, 1)
    grown = prompt + first.token_ids + TOOL_TOKENS
    before = small.prefill_tokens
    again = turn(small, grown, session="a")
    assert small.prefill_tokens - before == len(grown)
    assert again.token_ids == turn(engine, grown).token_ids
    assert small.session_caches.nbytes <= one_cache


def test_a_zero_budget_keeps_no_cache(tiny_models):
    none_kept = HFEngine(str(tiny_models["policy"]), session_cache_bytes=0)
    first = turn(none_kept, [1, 405, 202], session="a")
    assert first.token_ids and none_kept.session_caches.sessions == frozenset()
    assert none_kept.session_caches.evicted == 1  # counted: the budget is too small for it
