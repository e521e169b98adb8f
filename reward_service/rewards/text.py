"""Rewards that read only the completion text: format, tag_count, reasoning_steps, repetition_penalty,
code_format."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import regex

from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import Deadline, TextReward, ThreadRunner

# open-r1 `format_reward`: think block then answer block, nothing else.
# These run on the `regex` engine (same syntax and results as `re` for them) because it takes a timeout and
# releases the GIL while matching: R1_FORMAT is quadratic on text repeating "\n</think>\n<answer>\n".
R1_FORMAT = regex.compile(
    r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", regex.DOTALL | regex.MULTILINE
)
# TRL `think_format_reward`: one think block at the start, anything after it.
THINK_FORMAT = regex.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", regex.DOTALL | regex.MULTILINE)
# open-r1 `reasoning_steps_reward`; no MULTILINE there, so `^\d+\.` only matches at the very start.
STEP_PATTERN = regex.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


def _timeout(deadline: Deadline | None) -> float | None:
    return deadline.remaining() if deadline is not None else None


def format_value(text: str, params: dict[str, Any], deadline: Deadline | None = None) -> float:
    """1.0 when the whole completion matches the format, else 0.0.

    ``style="r1"`` (default, open-r1 ``format_reward``):
    ``^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$``;
    ``style="think"`` (TRL ``think_format_reward``): ``^<think>(?!.*<think>)(.*?)</think>.*$``.
    Both with DOTALL|MULTILINE and ``re.match``, as the references.
    """
    pattern = R1_FORMAT if params["style"] == "r1" else THINK_FORMAT
    return 1.0 if pattern.match(text, timeout=_timeout(deadline), concurrent=True) else 0.0


def tag_count_value(text: str, params: dict[str, Any], deadline: Deadline | None = None) -> float:
    """open-r1 ``tag_count_reward``: +0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``,
    ``\\n</answer>`` that occurs exactly once. Range [0, 1]."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return sum(0.25 for tag in tags if text.count(tag) == 1)


def reasoning_steps_value(text: str, params: dict[str, Any], deadline: Deadline | None = None) -> float:
    """open-r1 ``reasoning_steps_reward``: min(1, hits / min_steps) with hits = matches of
    ``(Step \\d+:|^\\d+\\.|\\n-|\\n\\*|First,|Second,|Next,|Finally,)`` (open-r1's "magic number" min_steps =
    3)."""
    hits = STEP_PATTERN.findall(text, timeout=_timeout(deadline), concurrent=True)
    return min(1.0, len(hits) / params["min_steps"])


def repetition_value(units: Sequence[Any], ngram_size: int, max_penalty: float) -> float:
    """Demystify-long-CoT App. C.2 (TRL/open-r1 ``repetition_penalty_reward``):
    ``(1 − #unique n-grams / #n-grams) · max_penalty``; 0.0 with fewer than ``ngram_size`` units. Range
    [max_penalty, 0]."""
    if len(units) < ngram_size:
        return 0.0
    ngrams = list(zip(*[units[i:] for i in range(ngram_size)], strict=False))
    scaling = 1 - len(set(ngrams)) / len(ngrams)
    return scaling * max_penalty if scaling else 0.0


class RepetitionPenalty:
    """n-gram repetition penalty over lower-cased whitespace words (open-r1, ``unit="words"``, default), over
    the characters of the lower-cased text (``unit="chars"``: text without spaces, e.g. Chinese or Japanese,
    where a "word" is the whole completion), or over completion token ids (TRL
    ``get_repetition_penalty_reward``, ``unit="tokens"``)."""

    description = RewardDescription(
        name="repetition_penalty",
        description="(1 - unique/total n-grams) * max_penalty; arXiv 2502.03373 App. C.2, open-r1 (words) / "
        "TRL (token ids); unit='chars' for text without spaces.",
        params=(
            ParamInfo("ngram_size", "integer", 3, "n of the n-grams.", minimum=1),
            ParamInfo(
                "max_penalty", "number", -1.0, "Penalty of a fully repetitive completion (<= 0).", maximum=0
            ),
            ParamInfo(
                "unit",
                "string",
                "words",
                "'words' (open-r1), 'chars' (characters, whitespace included) or 'tokens' (completion_ids, "
                "TRL).",
                choices=("words", "chars", "tokens"),
            ),
        ),
        min_value=None,
        max_value=0.0,
    )

    def __init__(self, runner: ThreadRunner):
        self._runner = runner

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        return await self._runner.map(samples, lambda s, _: self._one(s, params))

    @staticmethod
    def _one(s: Sample, params: dict[str, Any]) -> ComponentResult:
        if params["unit"] == "tokens":
            if not s.completion_ids and s.completion:
                return ComponentResult(error="completion_ids are required for unit='tokens'")
            units: Sequence[Any] = s.completion_ids
        elif params["unit"] == "chars":
            units = s.completion.lower()
        else:
            units = s.completion.lower().split()
        return ComponentResult(value=repetition_value(units, params["ngram_size"], params["max_penalty"]))


MAX_LANGUAGE_CHARS = 64


@functools.lru_cache(maxsize=64)
def code_format_pattern(language: str) -> regex.Pattern[str]:
    """open-r1 ``get_code_format_reward``'s pattern for ``language`` (escaped here: a language is data)."""
    fence = "```" + regex.escape(language)
    return regex.compile(
        rf"^<think>\n.*?\n</think>\n<answer>\n.*?{fence}.*?```.*?\n</answer>$", regex.DOTALL | regex.MULTILINE
    )


class CodeFormat:
    """open-r1 ``get_code_format_reward(language)``: 1.0 when the completion is a think block then an answer
    block holding a ```<language> fenced block, ``^<think>\\n.*?\\n</think>\\n<answer>\\n.*?```<language>
    .*?```.*?\\n</answer>$`` (DOTALL|MULTILINE, ``match``), else 0.0. A sample's metadata ``language``
    (open-r1's ``language`` column) overrides the ``language`` param."""

    description = RewardDescription(
        name="code_format",
        description="1 if <think>..</think><answer>..```<language>..```..</answer> (open-r1 "
        "code_format_reward); metadata 'language' overrides the param per sample.",
        params=(
            ParamInfo(
                "language", "string", "python", "Fence language, e.g. python, cpp; metadata 'language' wins."
            ),
        ),
        min_value=0.0,
        max_value=1.0,
    )

    def __init__(self, runner: ThreadRunner):
        self._runner = runner

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        return await self._runner.map(samples, lambda s, deadline: self._one(s, params, deadline))

    @staticmethod
    def _one(s: Sample, params: dict[str, Any], deadline: Deadline) -> ComponentResult:
        language = s.metadata.get("language", params["language"])
        if not isinstance(language, str) or not 0 < len(language) <= MAX_LANGUAGE_CHARS:
            return ComponentResult(
                error=f"the language (metadata or param) must be 1 to {MAX_LANGUAGE_CHARS} characters"
            )
        pattern = code_format_pattern(language)
        matched = pattern.match(s.completion, timeout=_timeout(deadline), concurrent=True)
        return ComponentResult(value=1.0 if matched else 0.0)


def text_rewards(runner: ThreadRunner) -> list[Any]:
    """format, tag_count, reasoning_steps, repetition_penalty, code_format, all run by ``runner``."""
    return [
        TextReward(
            RewardDescription(
                name="format",
                description="1 if the completion is <think>..</think><answer>..</answer> "
                "(open-r1 format_reward), or with style='think' TRL think_format_reward "
                "^<think>(?!.*<think>)(.*?)</think>.*$.",
                params=(
                    ParamInfo(
                        "style", "string", "r1", "'r1' (open-r1) or 'think' (TRL).", choices=("r1", "think")
                    ),
                ),
                min_value=0.0,
                max_value=1.0,
            ),
            format_value,
            runner,
        ),
        TextReward(
            RewardDescription(
                name="tag_count",
                description="0.25 per tag <think>\\n, \\n</think>\\n, \\n<answer>\\n, \\n</answer> "
                "occurring exactly once (open-r1 tag_count_reward).",
                min_value=0.0,
                max_value=1.0,
            ),
            tag_count_value,
            runner,
        ),
        TextReward(
            RewardDescription(
                name="reasoning_steps",
                description="min(1, #step markers / min_steps), markers Step N:, ^N., \\n-, \\n*, "
                "First, Second, Next, Finally, (open-r1 reasoning_steps_reward).",
                params=(ParamInfo("min_steps", "integer", 3, "Markers needed for full reward.", minimum=1),),
                min_value=0.0,
                max_value=1.0,
            ),
            reasoning_steps_value,
            runner,
        ),
        RepetitionPenalty(runner),
        CodeFormat(runner),
    ]
