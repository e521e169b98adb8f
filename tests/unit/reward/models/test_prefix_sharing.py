"""Shared-prefix computation: grouping rules, and exactness against the plain forward on real models."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, Gemma2Config, Gemma2ForCausalLM

from reward_service.core.types import Message, Sample
from reward_service.models.engine import Encoded
from reward_service.models.prefix import common_prefix_length, share_prefixes
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec
from tiny_models.tokenizer import build_tokenizer

PROMPTS = [
    (
        Message("system", "Be brief."),
        Message("user", "A baker makes 40 loaves and sells 25. How many are left?"),
    ),
    (Message("user", "Each box holds 12 apples and a crate holds 9 boxes. What is the total?"),),
]


def _completion(r: int, s: int) -> str:
    steps = [f"Step {k}: {r + 3} * {s + k} = {(r + 3) * (s + k)}." for k in range(1, 2 + (r + s) % 4)]
    return "\n\n".join([*steps, f"The answer is \\boxed{{{r * 10 + s}}}."])


def _requests() -> list[list[Sample]]:
    """Three GRPO-like requests (one prompt, several completions), one request mixing two prompts
    (a trainer step's call) and a request of a single sample (nothing to share)."""
    requests = [
        [Sample(id=f"{r}-{s}", prompt=PROMPTS[r % 2], completion=_completion(r, s)) for s in range(4)]
        for r in range(3)
    ]
    requests.append(
        [Sample(id=f"mix-{s}", prompt=PROMPTS[s % 2], completion=_completion(7, s)) for s in range(6)]
    )
    requests.append([Sample(id="alone", prompt=PROMPTS[0], completion=_completion(9, 9))])
    return requests


def _ids(*runs: list[int]) -> list[int]:
    return [token for run in runs for token in run]


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([5], [6]) == 0


def test_groups_share_exactly_their_common_tokens_and_keep_readouts_out():
    prompt = list(range(100, 130))  # 30 tokens
    items = [
        Encoded(input_ids=_ids(prompt, [1, 2, 3, 9]), positions=[33]),
        Encoded(input_ids=_ids(prompt, [1, 2, 4, 9, 9]), positions=[32, 34]),
        Encoded(input_ids=_ids(prompt, [7, 9]), positions=[31]),
    ]
    shared = share_prefixes(items, min_prefix_tokens=8)
    assert [e.input_ids for e in shared] == [e.input_ids for e in items]  # order and tokens unchanged
    assert all(e.prefix is shared[0].prefix for e in shared)  # one group, one Prefix object
    assert list(shared[0].prefix.input_ids) == prompt  # 30 tokens: the [1, 2] run is not common to all
    # A prefix stops before the first read-out position and leaves at least one token.
    early = [Encoded(input_ids=_ids(prompt, [1]), positions=[10]), Encoded(input_ids=_ids(prompt, [2]))]
    assert share_prefixes(early, 8)[0].prefix_tokens == 10
    twins = [Encoded(input_ids=list(prompt)), Encoded(input_ids=list(prompt))]
    assert all(e.prefix_tokens == 29 and e.suffix_tokens == 1 for e in share_prefixes(twins, 8))


def test_groups_follow_the_prompts_and_short_prefixes_are_not_shared():
    a, b = list(range(200, 240)), list(range(200, 210)) + list(range(300, 330))  # share 10 tokens
    items = [Encoded(input_ids=_ids(p, [s])) for p in (a, b, a, b) for s in (1,)]
    items += [Encoded(input_ids=_ids(a, [2])), Encoded(input_ids=_ids(b, [2]))]
    shared = share_prefixes(items, min_prefix_tokens=16)
    # Two groups of 40 shared tokens (saving 2 x 2 x 40) beat one of 10 (saving 5 x 10).
    by_prompt = {tuple(e.input_ids[:40]): e.prefix for e in shared}
    assert len({id(p) for p in by_prompt.values()}) == 2
    assert all(e.prefix_tokens == 40 for e in shared)
    # Below min_prefix_tokens nothing is grouped.
    assert all(e.prefix is None for e in share_prefixes(items[:2], min_prefix_tokens=16))
    assert share_prefixes(items[:1], 1)[0].prefix is None


async def _score_all(registry: ModelRegistry, reward: str) -> list[list]:
    results = await asyncio.gather(*(registry.score(reward, request, {}) for request in _requests()))
    return [[(r.value, r.step_scores, r.error) for r in request] for request in results]


@pytest.mark.parametrize(
    ("model_key", "kind"),
    [("prm-token", ModelKind.PRM), ("prm-steptag", ModelKind.PRM), ("orm", ModelKind.ORM)],
)
async def test_shared_prefix_scores_equal_the_plain_forward(tiny_models, model_key, kind):
    """Every format, concurrent requests: prefix sharing (plus the step-tag head) vs the plain path."""
    spec = ModelSpec(name="m", path=str(tiny_models[model_key]), kind=kind)
    fast = ModelRegistry(ModelSettings(max_wait_ms=20, min_shared_prefix_tokens=4, max_batch_tokens=600))
    plain = ModelRegistry(ModelSettings(max_wait_ms=20, share_prefixes=False))
    await fast.load(spec)
    await plain.load(spec)
    try:
        plain_engine = plain._require(spec.reward_name).engine
        plain_engine._set_fast_head(False)
        got, want = await _score_all(fast, spec.reward_name), await _score_all(plain, spec.reward_name)
        stats = fast.batcher_stats("m")
        plain_stats = plain.batcher_stats("m")
    finally:
        await fast.close()
        await plain.close()
    assert stats["prefix_tokens"] > 0 and plain_stats["prefix_tokens"] == 0
    assert stats["padded_tokens"] + stats["prefix_tokens"] < plain_stats["padded_tokens"]
    assert stats["forward_calls"] > 1  # max_batch_tokens cut the flush: prefixes reused across forwards
    for got_request, want_request in zip(got, want, strict=True):
        for (value, steps, error), (want_value, want_steps, want_error) in zip(
            got_request, want_request, strict=True
        ):
            assert error == want_error == ""
            assert value == pytest.approx(want_value, abs=1e-5)
            assert steps == pytest.approx(want_steps, abs=1e-5)


async def test_fast_paths_are_on_for_the_causal_tiny_models(tiny_models):
    registry = ModelRegistry(ModelSettings())
    for key, kind in (("prm-token", ModelKind.PRM), ("prm-steptag", ModelKind.PRM), ("orm", ModelKind.ORM)):
        await registry.load(ModelSpec(name=key, path=str(tiny_models[key]), kind=kind))
    try:
        engines = {key: slot.engine for key, slot in registry._slots.items()}
    finally:
        await registry.close()
    assert all(engine.share_prefixes for engine in engines.values())
    assert engines["prm-steptag"].fast_head
    assert not engines["prm-token"].fast_head and not engines["orm"].fast_head


async def test_settings_turn_prefix_sharing_off(tiny_models):
    registry = ModelRegistry(ModelSettings(share_prefixes=False))
    await registry.load(ModelSpec(name="p", path=str(tiny_models["prm-token"]), kind=ModelKind.PRM))
    try:
        await _score_all(registry, "prm:p")
        assert registry.batcher_stats("p")["prefix_tokens"] == 0
    finally:
        await registry.close()


@pytest.fixture(scope="module")
def bidirectional_orm(tmp_path_factory):
    """A tiny BERT sequence classifier: every token attends to the later ones too, so a prefix's
    keys depend on the suffix and computing it apart would change the scores."""
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = tmp_path_factory.mktemp("bert-orm")
    BertForSequenceClassification(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


async def test_prefix_sharing_stays_off_where_it_is_not_exact(bidirectional_orm):
    fast = ModelRegistry(ModelSettings(min_shared_prefix_tokens=4))
    plain = ModelRegistry(ModelSettings(share_prefixes=False))
    spec = ModelSpec(name="bert", path=str(bidirectional_orm), kind=ModelKind.ORM)
    await fast.load(spec)
    await plain.load(spec)
    try:
        assert not fast._require("orm:bert").engine.share_prefixes
        got, want = await _score_all(fast, "orm:bert"), await _score_all(plain, "orm:bert")
        assert fast.batcher_stats("bert")["prefix_tokens"] == 0
    finally:
        await fast.close()
        await plain.close()
    for got_request, want_request in zip(got, want, strict=True):
        for (value, _, _), (want_value, _, _) in zip(got_request, want_request, strict=True):
            assert value == pytest.approx(want_value, abs=1e-5)


@pytest.fixture(scope="module")
def softcapped_sliding_prm(tmp_path_factory):
    """A tiny Gemma2 causal LM as a step-tag PRM: its logits are soft-capped after the LM head (so
    reading two rows of the head is not its logits) and it has sliding-window layers."""
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        final_logit_softcapping=0.5,
        sliding_window=4,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    out = tmp_path_factory.mktemp("gemma2-prm")
    Gemma2ForCausalLM(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


async def test_head_and_cache_checks_keep_inexact_paths_off(softcapped_sliding_prm):
    fast = ModelRegistry(ModelSettings(min_shared_prefix_tokens=4))
    spec = ModelSpec(name="g", path=str(softcapped_sliding_prm), kind=ModelKind.PRM)
    await fast.load(spec)
    try:
        engine = fast._require("prm:g").engine
        assert not engine.fast_head and not engine.share_prefixes
        # Forced on, the two-row head really gives other scores: the check is what keeps it off.
        (request,) = _requests()[:1]
        encoded = [engine.encode(sample) for sample in request]
        plain = engine.forward(encoded)
        engine._set_fast_head(True)
        forced = engine.forward(encoded)
        engine._set_fast_head(False)
    finally:
        await fast.close()
    assert (
        max(abs(a - b) for x, y in zip(plain, forced, strict=True) for a, b in zip(x, y, strict=True)) > 1e-3
    )


async def test_a_model_that_cannot_score_the_probe_still_loads(tiny_models):
    """A sequence limit below the load-time probe's length: fast paths off, the model serves."""
    registry = ModelRegistry(ModelSettings(max_sequence_tokens=40))
    await registry.load(ModelSpec(name="p", path=str(tiny_models["prm-steptag"]), kind=ModelKind.PRM))
    try:
        engine = registry._require("prm:p").engine
        assert not engine.share_prefixes and not engine.fast_head
        samples = [Sample(id="s", completion="3 * 4 = 12"), Sample(id="l", completion=_completion(5, 5))]
        short, long = await registry.score("prm:p", samples, {})
    finally:
        await registry.close()
    assert short.error == "" and len(short.step_scores) == 1
    assert "40 positions" in long.error
