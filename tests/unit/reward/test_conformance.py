"""The peers' own test cases (open-r1, TRL, Math-Verify; ``peer_rewards.json``) through the Score core.

Every case is scored with its own reward and params. A case the peers' config reproduces (``supported``)
must give the peer's value; a case that needs another config (``supported: false``) must give what the
service documents for it (``expected_service``), and is listed below with the reason (docs/rewards.md says
the same). Every Math-Verify case is then scored a second time with the accuracy params that express its
test's own ``parse``/``verify`` config, and must give the test's value: no Math-Verify case differs then.

The cases are read from ``../shared/conformance`` when the project sits next to it, else from the copy in
``tests/assets/conformance`` (a clean clone has no ``../shared``); when both exist they must be identical.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from grpo_runtime.errors import InvalidArgument
from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.settings import CheckerSettings
from reward_service.core.scorer import Scorer
from reward_service.core.types import RewardRequest, Sample
from reward_service.rewards.registry import builtin_rewards
from reward_service.sandbox.runner import open_runner
from reward_service.sandbox.settings import SandboxSettings

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "conformance" / "peer_rewards.json"
COPY = ROOT / "tests" / "assets" / "conformance" / "peer_rewards.json"
MATH_VERIFY = "huggingface/Math-Verify:"

# Cases whose peer config the service cannot express, by source, with the reason (docs/rewards.md).
DIFFERENCES = {
    "huggingface/open-r1:tests/test_rewards.py:TestRewards.test_unparseable_solution[0]": "length: an "
    "unparseable gold gives no value (open-r1 counts it as correct), as TRL's accuracy does",
    "huggingface/open-r1:tests/test_rewards.py:TestRewards.test_unparseable_solution[1]": "same",
    "huggingface/open-r1:tests/test_rewards.py:TestRepetitionPenaltyReward.test_full_repetition_with_language"
    "[zh]": "repetition_penalty: no jieba word segmentation; unit='chars' is the option for Chinese",
    "huggingface/trl:tests/test_rewards.py:TestCosineScaledReward.test_correct_boundary_values[0]": "cosine "
    "unit='tokens' with completion_ids=[] and a non-empty completion: proto3 cannot tell [] from absent, "
    "so the service asks for the ids instead of taking length 0",
    "huggingface/trl:tests/test_rewards.py:TestCosineScaledReward.test_wrong_boundary_values[0]": "same",
}
# Math-Verify cases that the default (TRL) accuracy scores differently from their test's config, by the
# file's finding_class: each is reproduced by the params of its peer config (test_math_verify_cases...).
DEFAULT_DIFFERS_FROM_MATH_VERIFY_TESTS = {
    "no_anchor_extraction": "TRL extracts only \\boxed{} or an anchored answer: try_extract_without_anchor",
    "latex_only_answer": "TRL extracts LaTeX only: extraction=['latex', 'expr']",
    "trl_normalization": "TRL's NormalizationConfig has no malformed_operators/nits: normalize_*",
    "precision6": "the test's float_rounding: float_rounding",
    "strict": "the test's strict=False: strict",
    "no_set_relation_comp": "the test's allow_set_relation_comp=True: allow_set_relation_comp",
    "first_match": "TRL's extraction_mode='first_match': defaults='math_verify' (any_match)",
    "combination": "several of the above",
    "vacuous_zero": "0 either way, but TRL's because nothing is extracted",
}


def load_cases() -> list[dict[str, Any]]:
    if SHARED.exists():
        assert SHARED.read_bytes() == COPY.read_bytes(), f"{COPY} differs from {SHARED}: copy it again"
        return json.loads(SHARED.read_text())["cases"]
    return json.loads(COPY.read_text())["cases"]


CASES = load_cases()


def peer_params(peer_config: str) -> dict[str, Any]:
    """The accuracy params of a Math-Verify test's config: its ``compare_strings(gold, pred, match_types,
    precision, strict, allow_set_relation_comp)`` parses gold and answer alike with
    ``LatexExtractionConfig(boxed_match_priority=0)`` / ``ExprExtractionConfig()``; "parse() defaults" is
    ``verify(parse(gold), parse(pred))``."""
    params: dict[str, Any] = {"defaults": "math_verify", "gold_extraction": "answer"}
    if "parse() defaults" not in peer_config:
        params["extraction"] = ast.literal_eval(re.search(r"match_types=(\[.*?\])", peer_config).group(1))
        params["boxed_match_priority"] = 0
    params["float_rounding"] = int(re.search(r"precision=(\d+)", peer_config).group(1))
    params["strict"] = "strict=True" in peer_config
    params["allow_set_relation_comp"] = "allow_set_relation_comp=True" in peer_config
    return params


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scorer():
    pool = CheckerPool(CheckerSettings(workers=2, deadline_s=20))
    await pool.start()
    sandbox, status = await open_runner(SandboxSettings(wall_timeout_s=10, concurrency=4))
    assert sandbox is not None, f"the code cases need the sandbox: {status}"
    yield Scorer(builtin_rewards(pool, sandbox, True, ""), None, max_concurrent=64)
    await pool.close()


async def score_all(scorer: Scorer, runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[Any]:
    """(case, params) → the reward's ComponentResult, or the InvalidArgument of its request. One Score
    request per case group (samples scored together, as the peer test scored them), per case expecting an
    error, and per (reward, params) for the others."""
    requests: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, (case, params) in enumerate(runs):
        alone = case["source"] if case["expected"] == "INVALID_ARGUMENT" else ""
        requests[(case["reward"], json.dumps(params, sort_keys=True), case.get("group", alone))].append(i)
    results: list[Any] = [None] * len(runs)

    async def one(reward: str, params: str, group: str, indices: list[int]) -> None:
        samples = [
            Sample(
                id=str(i),
                completion=runs[i][0]["completion"],
                completion_ids=tuple(runs[i][0].get("completion_ids") or ()),
                metadata=runs[i][0]["metadata"],
                group=group or str(i),
            )
            for i in indices
        ]
        try:
            scored = await scorer.score(samples, [RewardRequest(reward, 1.0, json.loads(params))])
        except InvalidArgument as refused:
            for i in indices:
                results[i] = refused
            return
        for i, result in zip(indices, scored, strict=True):
            results[i] = result.components[0][1]

    await asyncio.gather(*(one(*key, indices) for key, indices in requests.items()))
    return results


def agrees(result: Any, expected: float | str | None, tol: float) -> bool:
    if expected == "INVALID_ARGUMENT":
        return isinstance(result, InvalidArgument) and result.field.startswith("rewards[0].params.")
    if isinstance(result, InvalidArgument):
        return False
    if expected is None:
        return result.value is None and bool(result.error)
    return result.value is not None and abs(result.value - expected) <= tol


async def test_every_case_gives_the_peer_value_or_the_documented_one(scorer):
    results = await score_all(scorer, [(case, case["params"]) for case in CASES])
    wrong = []
    for case, result in zip(CASES, results, strict=True):
        supported = case.get("supported", True)
        expected = case["expected"] if supported else case["expected_service"]
        if not agrees(result, expected, case["tol"]):
            wrong.append((case["source"], expected, result))
        if not supported:
            known = case["source"] in DIFFERENCES or (
                case["source"].startswith(MATH_VERIFY)
                and set(case["finding_class"].split("+")) <= set(DEFAULT_DIFFERS_FROM_MATH_VERIFY_TESTS)
            )
            assert known, f"{case['source']}: a difference without a documented reason"
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases differ: {wrong[:5]}"
    assert len(CASES) == 260
    assert {c["reward"] for c in CASES} >= {"accuracy", "format", "code", "soft_overlong", "length"}


async def test_math_verify_cases_all_pass_with_the_params_of_their_own_config(scorer):
    cases = [c for c in CASES if c["source"].startswith(MATH_VERIFY)]
    results = await score_all(scorer, [(c, peer_params(c["peer_config"])) for c in cases])
    wrong = [
        (c["source"], c["expected"], r)
        for c, r in zip(cases, results, strict=True)
        if not agrees(r, c["expected"], c["tol"])
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} Math-Verify cases differ: {wrong[:5]}"
    assert len(cases) == 134 and sum(not c.get("supported", True) for c in cases) == 28


async def test_only_the_listed_cases_still_differ():
    differing = {
        c["source"] for c in CASES if not c.get("supported", True) and not c["source"].startswith(MATH_VERIFY)
    }
    assert differing == set(DIFFERENCES)
