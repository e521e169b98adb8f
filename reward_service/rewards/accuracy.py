"""Rewards built on answer correctness: accuracy, reasoning_accuracy, length (Kimi 1.5) and cosine.

Correctness comes from math-verify in the checker pool (see ``reward_service.checkers``), so a hanging SymPy
comparison costs one sample an error, not the service a thread.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from reward_service.checkers.options import PRESETS, TRL, MathVerifyOptions
from reward_service.checkers.pool import CheckerPool
from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import Deadline, ThreadRunner, gold_answer, missing_metadata

ANSWER_KEY = ParamInfo(
    "answer_key", "string", "answer", "Metadata key of the gold answer (TRL datasets: 'solution')."
)
_HASHES = re.compile(r"####\s*(.+)")
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_number(text: str) -> float | None:
    """The seed's numeric answer: text after the last ``####``, else the first ``\\boxed{}``, else the whole
    text; then the last ``-?\\d+(\\.\\d+)?`` in it (commas dropped). None when there is no number."""
    hashes = _HASHES.findall(text)
    if hashes:
        candidate = hashes[-1]
    else:
        boxed = _BOXED.search(text)
        candidate = boxed.group(1) if boxed else text
    numbers = _NUMBER.findall(candidate.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def numeric_value(gold: str, completion: str) -> ComponentResult:
    """Seed ``verifiable``/``math`` tolerance: |Δ| <= 1e-4 → 1.0, |Δ| <= 1e-2 → 0.6, else 0.0; no gold number
    → no value; no number in the completion → 0.0."""
    expected = extract_number(gold)
    if expected is None:
        return ComponentResult(error=f"gold answer {gold[:80]!r} has no number")
    got = extract_number(completion)
    if got is None:
        return ComponentResult(value=0.0)
    delta = abs(got - expected)
    return ComponentResult(value=1.0 if delta <= 1e-4 else 0.6 if delta <= 1e-2 else 0.0)


# The accuracy params that tune math-verify: ``defaults`` picks a preset (options.TRL or
# options.MATH_VERIFY), every other one left unset (None) takes the preset's value. See options.py for
# the math-verify field each one sets.
MATH_PARAMS = (
    ParamInfo(
        "defaults",
        "string",
        "trl",
        "Preset of the options below: 'trl' (TRL accuracy_reward: LaTeX only, \\boxed or an anchor needed, "
        "no malformed-operator repair) or 'math_verify' (math_verify.parse defaults: LaTeX and plain "
        "expressions, no anchor needed, \\sqrt 2 and \\frac94 repaired, any_match).",
        choices=tuple(PRESETS),
    ),
    ParamInfo(
        "extraction",
        "array",
        None,
        "What the answer is extracted as, in order: 'latex' (LatexExtractionConfig), 'expr' "
        "(ExprExtractionConfig). trl: ['latex']; math_verify: ['latex', 'expr'].",
        choices=("latex", "expr"),
    ),
    ParamInfo(
        "try_extract_without_anchor",
        "boolean",
        None,
        "Extract without \\boxed{} or a 'final answer is' anchor. trl: false; math_verify: true.",
    ),
    ParamInfo(
        "boxed_match_priority",
        "integer",
        None,
        "Priority of \\boxed{}: 0 first, 50 after the answer patterns, -1 never. trl: 0; math_verify: 50.",
        minimum=-1,
        maximum=1000,
    ),
    ParamInfo("normalize_basic_latex", "boolean", None, "NormalizationConfig.basic_latex. Both: true."),
    ParamInfo("normalize_units", "boolean", None, "NormalizationConfig.units (drop units). Both: true."),
    ParamInfo(
        "normalize_malformed_operators",
        "boolean",
        None,
        "NormalizationConfig.malformed_operators (\\sqrt 2, \\frac94). trl: false; math_verify: true.",
    ),
    ParamInfo(
        "normalize_nits",
        "boolean",
        None,
        "NormalizationConfig.nits (spaces, dots). trl: false; math_verify: true.",
    ),
    ParamInfo(
        "normalize_boxed",
        "string",
        None,
        "NormalizationConfig.boxed: which \\boxed{} contents are kept. Both: 'all'.",
        choices=("all", "last", "none"),
    ),
    ParamInfo("normalize_equations", "boolean", None, "NormalizationConfig.equations. Both: false."),
    ParamInfo(
        "extraction_mode",
        "string",
        None,
        "parse extraction_mode. trl: 'first_match'; math_verify: 'any_match'.",
        choices=("first_match", "any_match"),
    ),
    ParamInfo(
        "fallback_mode",
        "string",
        None,
        "parse fallback_mode (keep the unparsed string of the first match). Both: 'first_match'.",
        choices=("first_match", "no_fallback"),
    ),
    ParamInfo(
        "gold_extraction",
        "string",
        None,
        "How the gold is parsed: 'default' (parse() defaults, as TRL) or 'answer' (the answer's extraction, "
        "as Math-Verify's tests). Both: 'default'.",
        choices=("default", "answer"),
    ),
    ParamInfo(
        "float_rounding", "integer", None, "verify float_rounding (decimals). Both: 6.", minimum=0, maximum=50
    ),
    ParamInfo(
        "numeric_precision",
        "integer",
        None,
        "verify numeric_precision (significant digits). Both: 15.",
        minimum=1,
        maximum=100,
    ),
    ParamInfo("strict", "boolean", None, "verify strict (variables must match). Both: true."),
    ParamInfo(
        "allow_set_relation_comp",
        "boolean",
        None,
        "verify allow_set_relation_comp (1 < x < 2 equals (1, 2)). Both: false.",
    ),
)
# Param name → MathVerifyOptions field, where they differ.
_OPTION_FIELDS = {
    "extraction": "targets",
    "gold_extraction": "gold",
    **{f"normalize_{name}": name for name in ("basic_latex", "units", "malformed_operators", "nits")},
    "normalize_boxed": "boxed",
    "normalize_equations": "equations",
}


def math_options(params: dict[str, Any]) -> MathVerifyOptions:
    """The ``defaults`` preset with every MATH_PARAMS param that is set."""
    tuned = (p.name for p in MATH_PARAMS if p.name != "defaults")
    overrides = {_OPTION_FIELDS.get(name, name): params[name] for name in tuned}
    return PRESETS[params["defaults"]].with_overrides(overrides)


async def correctness(
    pool: CheckerPool,
    samples: Sequence[Sample],
    answer_key: str,
    options: MathVerifyOptions = TRL,
    answers: Sequence[str | None] | None = None,
) -> list[ComponentResult]:
    """math-verify correctness (1.0/0.0) of every sample, in parallel over the pool's workers.

    The samples that share a gold (a group's completions) go to the pool together (``check_many``): one
    process hop per few answers, and the gold parsed once in the worker that checks them.

    ``answers``: the text to check per sample instead of its completion;
    None there means the sample has no answer, which scores 0.0.
    """
    checked = answers if answers is not None else [s.completion for s in samples]
    results = [ComponentResult() for _ in samples]
    by_gold: dict[str, list[tuple[int, str]]] = defaultdict(list)  # gold -> (sample index, text to check)
    for i, (sample, text) in enumerate(zip(samples, checked, strict=True)):
        gold = gold_answer(sample, answer_key)
        if gold is None:
            results[i] = missing_metadata(answer_key)
        elif text is None:
            results[i] = ComponentResult(value=0.0)
        else:
            by_gold[gold].append((i, text))

    async def check_group(gold: str, members: list[tuple[int, str]]) -> None:
        verdicts = await pool.check_many(gold, [text for _, text in members], options=options)
        for (i, _), (value, error) in zip(members, verdicts, strict=True):
            results[i] = ComponentResult(value=value, error=error)

    await asyncio.gather(*(check_group(gold, members) for gold, members in by_gold.items()))
    return results


class Accuracy:
    """TRL ``accuracy_reward``: ``float(verify(parse(gold), parse(completion, latex, boxed first)))``; no
    value when the gold cannot be parsed (TRL's None). ``defaults="math_verify"`` and the other MATH_PARAMS
    change the extraction and comparison (see ``math_options``). ``mode="numeric"``: the seed's numeric
    tolerance instead."""

    def __init__(self, pool: CheckerPool, runner: ThreadRunner):
        self._pool = pool
        self._runner = runner  # numeric mode runs in a thread, as the text rewards
        self.description = RewardDescription(
            name="accuracy",
            description="math-verify: 1.0 if verify(gold, answer) else 0.0, gold unparseable -> unset (TRL "
            "accuracy_reward; defaults='math_verify': math-verify's own extraction). mode='numeric': "
            "|Δ|<=1e-4 -> 1.0, <=1e-2 -> 0.6, else 0.",
            params=(
                ParamInfo(
                    "mode",
                    "string",
                    "math_verify",
                    "'math_verify' or 'numeric' (the other params apply to 'math_verify').",
                    choices=("math_verify", "numeric"),
                ),
                ANSWER_KEY,
                *MATH_PARAMS,
            ),
            required_metadata=("answer",),
            min_value=0.0,
            max_value=1.0,
        )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        key = params["answer_key"]
        if params["mode"] == "math_verify":
            return await correctness(self._pool, samples, key, math_options(params))

        def one(s: Sample, _: Deadline) -> ComponentResult:
            gold = gold_answer(s, key)
            return missing_metadata(key) if gold is None else numeric_value(gold, s.completion)

        return await self._runner.map(samples, one)


def final_answer(completion: str, delimiters: Sequence[str]) -> str | None:
    """TRL ``reasoning_accuracy_reward``'s split: the text after the last occurrence of the first delimiter
    (in list order) that occurs in the completion; None when none does (the reasoning never closed)."""
    for delimiter in delimiters:
        if delimiter in completion:
            return completion.rsplit(delimiter, 1)[-1]
    return None


class ReasoningAccuracy:
    """TRL ``reasoning_accuracy_reward``: accuracy of the text after the reasoning (``</think>``); 0.0 when
    the reasoning is not closed (before the gold is even parsed, as TRL), no value when the gold cannot be
    parsed. Takes accuracy's math-verify params."""

    def __init__(self, pool: CheckerPool):
        self._pool = pool
        self.description = RewardDescription(
            name="reasoning_accuracy",
            description="accuracy of the text after the last reasoning delimiter (default </think>); 0.0 "
            "when no delimiter occurs (TRL reasoning_accuracy_reward).",
            params=(
                ParamInfo(
                    "reasoning_delimiters",
                    "array",
                    ["</think>"],
                    "Strings that end the reasoning; the first one (in this order) found in the completion "
                    "splits it at its last occurrence.",
                ),
                ANSWER_KEY,
                *MATH_PARAMS,
            ),
            required_metadata=("answer",),
            min_value=0.0,
            max_value=1.0,
        )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        answers = [final_answer(s.completion, params["reasoning_delimiters"]) for s in samples]
        return await correctness(self._pool, samples, params["answer_key"], math_options(params), answers)


def group_indices(samples: Sequence[Sample]) -> list[list[int]]:
    """Indices of the samples of each group (``Sample.group``); samples without a group form one group."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.group].append(i)
    return list(groups.values())


class LengthReward:
    """Kimi 1.5 length reward (arXiv 2501.12599, open-r1 ``len_reward``), per group:

    ``λ = 0.5 − (len − min_len) / (max_len − min_len)`` with len in characters and min/max over the group;
    correct → λ, wrong → min(0, λ); all lengths equal → 0.0.

    Correctness is ``accuracy``'s, with its math-verify params. Differs from open-r1 in one place: open-r1
    counts an unparseable gold as correct; here such a sample gets no value (an error), as TRL's accuracy
    does. Its length still counts toward the group's min/max.
    """

    def __init__(self, pool: CheckerPool):
        self._pool = pool
        self.description = RewardDescription(
            name="length",
            description="Kimi 1.5: λ = 0.5 - (len-min)/(max-min) over the group (chars); "
            "correct -> λ, wrong -> min(0, λ) (open-r1 len_reward).",
            params=(ANSWER_KEY, *MATH_PARAMS),
            required_metadata=("answer",),
            min_value=-0.5,
            max_value=0.5,
            group_aware=True,
        )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        correct = await correctness(self._pool, samples, params["answer_key"], math_options(params))
        results: list[ComponentResult] = [ComponentResult() for _ in samples]
        for members in group_indices(samples):
            lengths = {i: len(samples[i].completion) for i in members}
            low, high = min(lengths.values()), max(lengths.values())
            for i in members:
                if correct[i].value is None:
                    results[i] = ComponentResult(error=correct[i].error)
                    continue
                if high == low:
                    results[i] = ComponentResult(value=0.0)
                    continue
                lam = 0.5 - (lengths[i] - low) / (high - low)
                results[i] = ComponentResult(value=float(lam if correct[i].value == 1.0 else min(0.0, lam)))
        return results


def cosine_value(correct: bool, length: int, params: dict[str, Any]) -> float:
    """``v_min + ½(v_max − v_min)(1 + cos(π·p))`` with ``p = len/max_len`` (clamped to 1 when ``clamp``, TRL;
    open-r1 does not clamp). Correct: (v_min, v_max) = (min_value_correct, max_value_correct); wrong: swapped,
    (max_value_wrong, min_value_wrong)."""
    progress = length / params["max_len"]
    if params["clamp"]:
        progress = min(progress, 1.0)
    cosine = math.cos(progress * math.pi)
    if correct:
        low, high = params["min_value_correct"], params["max_value_correct"]
    else:
        low, high = params["max_value_wrong"], params["min_value_wrong"]
    return float(low + 0.5 * (high - low) * (1.0 + cosine))


class CosineReward:
    """Cosine-scaled correctness reward (arXiv 2502.03373 App. C.1; TRL ``get_cosine_scaled_reward``,
    open-r1 ``get_cosine_scaled_reward``). See ``cosine_value``; correctness is ``accuracy``'s, with its
    math-verify params."""

    def __init__(self, pool: CheckerPool):
        self._pool = pool
        self.description = RewardDescription(
            name="cosine",
            description="v_min + 0.5(v_max-v_min)(1+cos(pi*len/max_len)); correct: (min,max)_correct, wrong: "
            "swapped (max,min)_wrong; arXiv 2502.03373 (TRL/open-r1 cosine_scaled_reward).",
            params=(
                ParamInfo(
                    "max_len", "integer", 1000, "Length L_max that normalises the schedule.", minimum=1
                ),
                ParamInfo("min_value_wrong", "number", -1.0, "Wrong answer, shortest length."),
                ParamInfo("max_value_wrong", "number", -0.5, "Wrong answer, longest length."),
                ParamInfo("min_value_correct", "number", 0.5, "Correct answer, longest length."),
                ParamInfo("max_value_correct", "number", 1.0, "Correct answer, shortest length."),
                ParamInfo(
                    "unit",
                    "string",
                    "chars",
                    "'chars' (open-r1) or 'tokens' (completion_ids, TRL).",
                    choices=("chars", "tokens"),
                ),
                ParamInfo("clamp", "boolean", True, "Clamp len/max_len to 1 (TRL); false = open-r1."),
                ANSWER_KEY,
                *MATH_PARAMS,
            ),
            required_metadata=("answer",),
            min_value=-1.0,
            max_value=1.0,
        )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        correct = await correctness(self._pool, samples, params["answer_key"], math_options(params))
        results = []
        for s, c in zip(samples, correct, strict=True):
            if c.value is None:
                results.append(ComponentResult(error=c.error))
            elif params["unit"] == "tokens" and not s.completion_ids and s.completion:
                results.append(ComponentResult(error="completion_ids are required for unit='tokens'"))
            else:
                length = len(s.completion_ids) if params["unit"] == "tokens" else len(s.completion)
                results.append(ComponentResult(value=cosine_value(c.value == 1.0, length, params)))
        return results


class SoftOverlong:
    """DAPO soft overlong punishment (arXiv 2503.14476 eq. 13; TRL ``get_soft_overlong_punishment``), L =
    number of completion tokens: ``0`` if L <= L_max − L_c; ``((L_max − L_c) − L) / L_c`` if L <= L_max;
    ``−1`` beyond."""

    description = RewardDescription(
        name="soft_overlong",
        description="DAPO eq. 13 over len(completion_ids): 0 up to L_max-L_c, linear down to -1 at L_max, -1 "
        "beyond (TRL soft_overlong_punishment).",
        params=(
            ParamInfo("max_completion_len", "integer", 16384, "L_max in tokens.", minimum=1),
            ParamInfo("soft_punish_cache", "integer", 4096, "L_c in tokens.", minimum=0),
        ),
        min_value=-1.0,
        max_value=0.0,
    )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        lmax, cache = params["max_completion_len"], params["soft_punish_cache"]
        results = []
        for s in samples:
            if not s.completion_ids and s.completion:
                results.append(ComponentResult(error="completion_ids are required"))
                continue
            n = len(s.completion_ids)
            if n <= lmax - cache:
                value = 0.0
            elif n <= lmax:
                value = (lmax - cache - n) / cache
            else:
                value = -1.0
            results.append(ComponentResult(value=float(value)))
        return results
