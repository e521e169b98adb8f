"""Judge prompt templates: which fields a template names and how a sample fills them.

A template is ``str.format`` text restricted to plain names: ``{prompt}`` (the prompt's non-system turns,
joined by newlines), ``{completion}`` (pointwise), ``{completions}`` and ``{index}`` (group: the numbered
list of a group's completions and the number of the one being judged), and any other name, read from the
sample's metadata (``{answer}``, ``{rubric}``, ...). ``{{``/``}}`` are literal braces. Attribute or index
access, conversions and format specs are refused when the template is read, so filling it is plain
concatenation: a completion or a metadata value is inserted as text and never interpreted.

Torch-free: the local judge engine and the remote (HTTP) judge share it.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import Sample
from reward_service.rewards.base import gold_answer

SAMPLE_FIELDS = frozenset({"prompt", "completion", "completions", "index"})
# The sample fields each kind of template must name (``{prompt}`` is optional in every kind):
# ``pointwise`` judges one completion; ``group`` lists a group's completions and asks about ``{index}``
# (a local judge reads one verdict per completion); ``group_scores`` lists them and asks for a score
# of each in one answer (a remote judge, RULER's way).
KINDS = {"pointwise": ("completion",), "group": ("completions", "index"), "group_scores": ("completions",)}

DEFAULT_POINTWISE_TEMPLATE = (
    "Judge whether the response answers the question correctly.\n\n"
    "Question:\n{prompt}\n\nReference answer: {answer}\n\nResponse:\n{completion}\n\n"
    "Is the response correct? Answer Yes or No."
)
# RULER-style (OpenPipe ART): the judge sees every completion of the prompt before judging one of them.
DEFAULT_GROUP_TEMPLATE = (
    "Judge the responses to the question against each other.\n\n"
    "Question:\n{prompt}\n\nReference answer: {answer}\n\nResponses:\n{completions}\n\n"
    "Is response [{index}] correct? Answer Yes or No."
)
DEFAULT_GROUP_SCORES_TEMPLATE = (
    "Judge the responses to the question against each other.\n\n"
    "Question:\n{prompt}\n\nReference answer: {answer}\n\nResponses:\n{completions}\n\n"
    "Score every response from 0 (wrong) to 10 (right), one line each, written as [number]: score."
)


# Put in the middle of a completion cut to fit a judge's context, so the judge sees the cut.
TRUNCATION_MARKER = "\n[... {cut} of {total} {unit} of this response cut to fit the judge's context ...]\n"
# What cut_middle cuts: a string's characters or a list of token ids (its pieces come back as the same type).
PiecesT = TypeVar("PiecesT", str, list[int])


def cut_middle(pieces: PiecesT, keep: int, unit: str) -> tuple[PiecesT, PiecesT, str] | None:
    """(head, tail, marker) keeping ``keep`` of ``pieces`` (a string's characters or token ids), half at
    each end, for the caller to join as head + marker + tail; None when nothing needs cutting."""
    if len(pieces) <= keep:
        return None
    head, tail = keep - keep // 2, keep // 2
    marker = TRUNCATION_MARKER.format(cut=len(pieces) - keep, total=len(pieces), unit=unit)
    return pieces[:head], (pieces[len(pieces) - tail :] if tail else pieces[:0]), marker


def prompt_text(sample: Sample) -> str:
    """The prompt's non-system turns joined by newlines (a system prompt is for the policy)."""
    return "\n".join(m.content for m in sample.prompt if m.role != "system")


def numbered(completions: Sequence[str]) -> str:
    """``[1] first\\n\\n[2] second ...``: the ``{completions}`` of a group template."""
    return "\n\n".join(f"[{k}] {text}" for k, text in enumerate(completions, start=1))


@dataclass(frozen=True)
class JudgeTemplate:
    """A parsed template: literal text and field names alternating (``parts``)."""

    text: str
    parts: tuple[tuple[str, str | None], ...]  # (literal, field or None)
    kind: str  # one of KINDS

    @classmethod
    def parse(cls, text: str, *, kind: str, field: str = "template") -> JudgeTemplate:
        """Reads ``text`` as a template of ``kind`` (``KINDS``); InvalidArgument naming ``field`` when it is
        malformed, lacks a field its kind needs or names one of another kind."""
        try:
            raw = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise InvalidArgument(f"not a template: {exc}", field=field) from exc
        parts = []
        for literal, name, spec, conversion in raw:
            if name is not None and (not name.isidentifier() or spec or conversion):
                raise InvalidArgument(
                    f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: fields "
                    "are plain names (no attributes, indexes, conversions or format specs)",
                    field=field,
                )
            parts.append((literal, name))
        names = [name for _, name in parts if name is not None]
        required = KINDS[kind]
        for name in required:
            if name not in names:
                raise InvalidArgument(f"a {kind} template needs {{{name}}}", field=field)
        for name in SAMPLE_FIELDS - {"prompt", *required}:
            if name in names:
                raise InvalidArgument(f"{{{name}}} is not a field of a {kind} template", field=field)
        if kind == "group" and names.index("index") < max(
            i for i, n in enumerate(names) if n == "completions"
        ):
            # The text up to {index} is the same for every completion of the group: one shared prefix.
            raise InvalidArgument("{index} must come after {completions}", field=field)
        return cls(text=text, parts=tuple(parts), kind=kind)

    @property
    def metadata_fields(self) -> tuple[str, ...]:
        """Names read from the sample's metadata, in order of first use."""
        seen: dict[str, None] = {}
        for _, name in self.parts:
            if name is not None and name not in SAMPLE_FIELDS:
                seen.setdefault(name)
        return tuple(seen)

    def metadata(self, sample: Sample) -> dict[str, str]:
        """The metadata values this template needs, as text; TemplateError naming the first one missing."""
        values = {}
        for name in self.metadata_fields:
            value = gold_answer(sample, name)
            if value is None:
                raise TemplateError(f"metadata '{name}' is required by the judge's template")
            values[name] = value
        return values

    def fill(self, values: dict[str, str]) -> str:
        """The template with every field replaced by ``values[field]`` (plain concatenation)."""
        return "".join(literal + (values[name] if name is not None else "") for literal, name in self.parts)


class TemplateError(Exception):
    """A sample lacks a field its judge's template names; becomes that sample's component error."""


def judge_templates(pointwise: str | None, group: str | None) -> tuple[JudgeTemplate, JudgeTemplate]:
    """A local judge's (pointwise, group) templates, None meaning the default; InvalidArgument naming
    ``judge_template`` or ``judge_group_template``."""
    return (
        JudgeTemplate.parse(
            pointwise or DEFAULT_POINTWISE_TEMPLATE, kind="pointwise", field="judge_template"
        ),
        JudgeTemplate.parse(group or DEFAULT_GROUP_TEMPLATE, kind="group", field="judge_group_template"),
    )
