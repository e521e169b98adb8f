"""OpenRLHF's remote reward-model protocol ↔ the reward service's domain objects (no scoring here).

Request (``POST /get_reward``, what OpenRLHF's ``remote_rm_fn`` sends)::

    {"query": ["<prompt><completion>", ...], "prompts": ["<prompt>", ...], "labels": ["<gold>", ...]}

``query[i]`` is the decoded prompt + completion and ``prompts[i]`` its prompt text. The completion is what
follows the prompt in ``query[i]``, minus the end-of-sequence suffixes of ``strip_suffixes``; where the
prompt ends:

- after ``prompts[i]`` when ``query[i]`` starts with it (without ``prompts``, the whole query is the
  completion);
- else after the longest suffix of ``prompts[i]`` that ``query[i]`` starts with, leading U+FFFD characters
  counted as prompt: OpenRLHF 0.11 keeps only the last tokens of a prompt too long for ``max_len`` but still
  sends the whole prompt text, and a cut inside a multi-byte character decodes as U+FFFD. A query that
  starts with no (non-empty) suffix of its prompt is an error naming ``query[i]``. The match is
  Knuth-Morris-Pratt (:func:`prompt_overlap`), linear in the shorter of the two texts.

The prompt reaches the rewards, as sent, as one user message. ``labels[i]`` (optional) is the
sample's metadata: a text or number label under ``label_key`` (``answer``, what ``accuracy`` reads), an
object as the metadata itself (several columns), null as none. An empty ``query`` list (what OpenRLHF sends
to its second and later ``--remote_rm_url`` when a batch has fewer samples than URLs) is answered with empty
lists under the same keys, without scoring.

Response::

    {"rewards": [float, ...], "scores": [float in [0, 1], ...], "extra_logs": {"<reward>": [float, ...]}}

``rewards[i] = Σ weight·value`` (:mod:`reward_service.core.scorer`), ``missing_reward`` where no component
has a value; ``scores[i] = clamp((rewards[i] − low) / (high − low), 0, 1)`` with [low, high] =
``score_range`` or the rewards' declared bounds, else ``clamp(rewards[i], 0, 1)`` (OpenRLHF filters groups
on them);
``extra_logs`` holds each component's values (``missing_reward`` where it has none) and ``reward_missing``
(1.0 where no component scored).

Which rewards: ``?rewards=a,b&weights=2,0.5`` (comma lists, weights optional), else the ``http.rewards`` of
the config. A named reward takes params (and its weight, when ``weights`` is absent) from its
``http.rewards`` entry.

Cost: :func:`columns_of` looks only at the body's top level, so the caller checks the counts (``max_samples``)
before :func:`samples_of` reads any item; each item is refused as soon as it is past its limit (a completion
over ``max_completion_chars`` as sent, a prompt over ``max_prompt_chars``, a label past
``max_metadata_chars`` or the nesting limit), and every step is linear in what it reads. The one step in
Python per character is the prompt match, taken only for a query that does not start with its whole prompt:
about a second per million characters. Parsing and building samples take seconds of Python near
``max_body_bytes``: the endpoint runs them off the event loop.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.struct_codec import MAX_STRUCT_DEPTH
from reward_service.core.scorer import ScoreLimits
from reward_service.core.types import Message, RewardRequest, Sample, SampleResult
from reward_service.http.settings import HttpSettings

_REPLACEMENT = "\ufffd"  # what a tokenizer decodes a partial UTF-8 sequence as


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(body: bytes) -> Any:
    """The JSON body; InvalidArgument for text that is not JSON (NaN and Infinity included)."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the decoder's stack
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)[:200]
        raise InvalidArgument(f"not valid JSON ({reason})", field="body") from None


@dataclass(frozen=True)
class Columns:
    """The body's three lists, checked only at the top level (no item read yet)."""

    queries: list[Any]
    prompts: list[Any] | None
    labels: list[Any] | None


def _list(body: Mapping[str, Any], key: str, required: bool) -> list[Any] | None:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidArgument("is required (a list of strings)", field=key)
        return None
    if not isinstance(value, list):
        raise InvalidArgument(f"must be a list, got {type(value).__name__}", field=key)
    return value


def columns_of(body: Any) -> Columns:
    """The body's ``query``, ``prompts`` and ``labels`` lists; InvalidArgument naming the key. Reads no
    item, so it costs the same for any body."""
    if not isinstance(body, dict):
        raise InvalidArgument(f"must be a JSON object, got {type(body).__name__}", field="body")
    queries = _list(body, "query", required=True)
    assert queries is not None
    prompts, labels = _list(body, "prompts", required=False), _list(body, "labels", required=False)
    for key, values in (("prompts", prompts), ("labels", labels)):
        if values is not None and len(values) != len(queries):
            raise InvalidArgument(f"has {len(values)} items for {len(queries)} queries", field=key)
    return Columns(queries, prompts, labels)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"must be a string, got {type(value).__name__}", field=field)
    return value


def _check_label(label: dict[str, Any], field: str, max_chars: int) -> None:
    """Refuses an object label nested past MAX_STRUCT_DEPTH, or past ``max_chars`` characters (counted as
    :func:`reward_service.core.scorer.json_chars` counts them) as soon as the walk gets there."""
    chars, stack = 0, [(label, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_STRUCT_DEPTH:
            raise InvalidArgument(f"nested deeper than {MAX_STRUCT_DEPTH} levels", field=field)
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, dict):
            chars += 1 + sum(len(k) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            chars += 1
            stack.extend((v, depth + 1) for v in item)
        else:
            chars += 1
        if chars > max_chars:
            raise InvalidArgument(f"more than max_metadata_chars={max_chars} characters", field=field)


def _metadata(label: Any, index: int, label_key: str, max_chars: int) -> dict[str, Any]:
    field = f"labels[{index}]"
    if label is None:
        return {}
    if isinstance(label, bool) or not isinstance(label, str | int | float | dict):
        raise InvalidArgument(
            f"must be a string, number, object or null, got {type(label).__name__}", field=field
        )
    if isinstance(label, dict):
        _check_label(label, field, max_chars)
        return label
    return {label_key: label}


@functools.lru_cache(maxsize=8)
def _tail(suffixes: tuple[str, ...]) -> re.Pattern[str]:
    """What :func:`_strip` removes, read on the reversed text: whitespace and the reversed suffixes, tried
    in that order at each position, as ``str.rstrip`` then the first matching suffix would be. Possessive:
    one pass, no backtracking state kept per token. A suffix ending in whitespace never matches (``\\s``
    takes that character first), just as it never could once the text is rstripped."""
    tokens = [r"\s", *(re.escape(suffix[::-1]) for suffix in suffixes if suffix)]
    return re.compile(f"(?:{'|'.join(tokens)})*+")


def _strip(completion: str, suffixes: Sequence[str]) -> str:
    """``completion`` without trailing whitespace and any run of ``suffixes`` at its end. One regex pass
    over the reversed text, linear in its length: cutting one suffix at a time would copy the text once
    per suffix, quadratic in a long run of them."""
    tail = _tail(tuple(suffixes)).match(completion[::-1])
    assert tail is not None  # a starred pattern matches at least the empty string
    removed = tail.end()
    return completion[: len(completion) - removed]


def prompt_overlap(prompt: str, query: str) -> int:
    """Length (characters) of the longest suffix of ``prompt`` that is a prefix of ``query``.

    Knuth-Morris-Pratt with ``query[:n]`` as the pattern and ``prompt[-n:]`` as the text, ``n`` the shorter
    length (no longer overlap exists): the state after the last character of the text is the longest
    prefix of the pattern ending there. O(n) steps whatever the text; trying each suffix with startswith
    would be O(n²) on text like ``"aaa…"``."""
    n = min(len(prompt), len(query))
    if n == 0:
        return 0
    pattern, text = query[:n], prompt[len(prompt) - n :]
    failure = [0] * n  # failure[j]: the longest proper border of pattern[: j + 1]
    k = 0
    for j in range(1, n):
        char = pattern[j]
        while k and pattern[k] != char:
            k = failure[k - 1]
        if pattern[k] == char:
            k += 1
        failure[j] = k
    k = 0
    for char in text:
        while k and (k == n or pattern[k] != char):
            k = failure[k - 1]
        if pattern[k] == char:
            k += 1
    return k


def _prompt_end(query: str, prompt: str, index: int, limits: ScoreLimits) -> int:
    """Where ``query[index]``'s completion starts (module docstring): after ``prompt`` when the query starts
    with it, else after the longest suffix of ``prompt`` it starts with (a left-truncated prompt), U+FFFD
    characters first skipped. The sizes are checked before the match, whose cost is linear in them."""
    field = f"query[{index}]"
    if len(prompt) > limits.max_prompt_chars:
        raise InvalidArgument(
            f"{len(prompt)} characters, at most max_prompt_chars={limits.max_prompt_chars}",
            field=f"prompts[{index}]",
        )
    if len(query) - len(prompt) > limits.max_completion_chars:  # the completion is at least this long
        raise InvalidArgument(
            f"{len(query) - len(prompt)} characters after its prompt, at most "
            f"max_completion_chars={limits.max_completion_chars}",
            field=field,
        )
    if query.startswith(prompt):
        return len(prompt)
    # A cut inside a multi-byte character decodes as U+FFFD: those characters belong to the prompt.
    skipped = len(query) - len(query.lstrip(_REPLACEMENT))
    cut = skipped + prompt_overlap(prompt, query[skipped:])
    if cut == 0:
        raise InvalidArgument(f"starts with no suffix of prompts[{index}]", field=field)
    if len(query) - cut > limits.max_completion_chars:
        raise InvalidArgument(
            f"{len(query) - cut} characters after the end of its prompt, at most "
            f"max_completion_chars={limits.max_completion_chars}",
            field=field,
        )
    return cut


def samples_of(columns: Columns, settings: HttpSettings, limits: ScoreLimits) -> list[Sample]:
    """The request's samples, ids ``"0"``, ``"1"``, ... in order; InvalidArgument names the item. Call it
    once the counts are known to be within the limits."""
    samples = []
    for i, item in enumerate(columns.queries):
        query = _text(item, f"query[{i}]")
        prompt = _text(columns.prompts[i], f"prompts[{i}]") if columns.prompts is not None else ""
        cut = _prompt_end(query, prompt, i, limits)
        label = columns.labels[i] if columns.labels is not None else None
        samples.append(
            Sample(
                id=str(i),
                completion=_strip(query[cut:], settings.strip_suffixes),
                prompt=(Message(role="user", content=prompt),) if prompt else (),
                metadata=_metadata(label, i, settings.label_key, limits.max_metadata_chars),
            )
        )
    return samples


def rewards_of(query: Mapping[str, str], settings: HttpSettings) -> list[RewardRequest]:
    """The rewards to compute, from ``?rewards=&weights=`` or else the configuration (module docstring)."""
    configured = {r.name: r for r in settings.rewards}
    names_text = query.get("rewards")
    if names_text is None:
        if "weights" in query:
            raise InvalidArgument("needs ?rewards= naming the rewards it weighs", field="weights")
        if not configured:
            raise InvalidArgument(
                "no rewards: pass ?rewards=name,... or configure http.rewards on the server", field="rewards"
            )
        return [RewardRequest(name=r.name, weight=r.weight, params=dict(r.params)) for r in settings.rewards]
    names = [name.strip() for name in names_text.split(",")]
    for i, name in enumerate(names):
        if not name:
            raise InvalidArgument("empty reward name", field=f"rewards[{i}]")
    weights: list[float | None] = [None] * len(names)
    if "weights" in query:
        parts = query["weights"].split(",")
        if len(parts) != len(names):
            raise InvalidArgument(f"has {len(parts)} weights for {len(names)} rewards", field="weights")
        for i, part in enumerate(parts):
            try:
                weight = float(part)
            except ValueError:
                raise InvalidArgument(f"not a number: {part[:40]!r}", field=f"weights[{i}]") from None
            if not math.isfinite(weight):
                raise InvalidArgument(f"must be finite, got {part[:40]!r}", field=f"weights[{i}]")
            weights[i] = weight
    requests = []
    for name, query_weight in zip(names, weights, strict=True):
        entry = configured.get(name)
        default_weight = entry.weight if entry is not None else 1.0
        requests.append(
            RewardRequest(
                name=name,
                weight=default_weight if query_weight is None else query_weight,
                params=dict(entry.params) if entry is not None else {},
            )
        )
    return requests


def response_of(
    results: Sequence[SampleResult],
    rewards: Sequence[RewardRequest],
    bounds: tuple[float, float] | None,
    missing: float,
) -> dict[str, Any]:
    """The ``/get_reward`` response body (module docstring)."""

    def finite(value: float | None) -> float:
        return value if value is not None and math.isfinite(value) else missing

    totals = [finite(r.reward) for r in results]
    if bounds is None:
        scores = [min(1.0, max(0.0, total)) for total in totals]
    else:
        low, high = bounds
        scores = [min(1.0, max(0.0, (total - low) / (high - low))) for total in totals]
    logs: dict[str, list[float]] = {spec.name: [] for spec in rewards}
    for result in results:
        for name, component in result.components:
            logs[name].append(finite(component.value))
    logs["reward_missing"] = [
        0.0 if r.reward is not None and math.isfinite(r.reward) else 1.0 for r in results
    ]
    return {"rewards": totals, "scores": scores, "extra_logs": logs}
