"""Judge templates: what a template may name, how samples fill it, and the errors naming what is wrong."""

from __future__ import annotations

import pytest

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import Message, Sample
from reward_service.judges.template import (
    DEFAULT_GROUP_SCORES_TEMPLATE,
    JudgeTemplate,
    TemplateError,
    cut_middle,
    judge_templates,
    numbered,
    prompt_text,
)

SAMPLE = Sample(
    id="a",
    completion="The answer is 7.",
    prompt=(Message("system", "Be brief."), Message("user", "What is 3 + 4?")),
    metadata={"answer": 7.0, "rubric": "exact"},
)


def test_defaults_parse_and_name_their_metadata():
    pointwise, group = judge_templates(None, None)
    assert pointwise.metadata_fields == ("answer",)
    assert group.metadata_fields == ("answer",)
    assert JudgeTemplate.parse(DEFAULT_GROUP_SCORES_TEMPLATE, kind="group_scores").metadata_fields == (
        "answer",
    )


def test_fill_is_plain_concatenation_of_sample_text():
    template = JudgeTemplate.parse(
        "Q: {prompt} | A: {answer} | R: {completion} {{literal}}", kind="pointwise"
    )
    hostile = "{answer.__class__} {0} {{x}}"
    values = {"prompt": prompt_text(SAMPLE), **template.metadata(SAMPLE), "completion": hostile}
    # No system turn; the number written as an integer; braces in a completion stay as they are.
    assert template.fill(values) == "Q: What is 3 + 4? | A: 7 | R: {answer.__class__} {0} {{x}} {literal}"


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("{completion.__class__}", "pointwise", "plain names"),
        ("{completion!r}", "pointwise", "plain names"),
        ("{completion:>10}", "pointwise", "plain names"),
        ("{0} {completion}", "pointwise", "plain names"),
        ("no field at all", "pointwise", "needs {completion}"),
        ("{completions} [{index}]", "pointwise", "needs {completion}"),
        ("{completion} {completions}", "group_scores", "not a field"),
        ("[{index}] {completions}", "group", "{index} must come after {completions}"),
        ("{completions}", "group", "needs {index}"),
        ("unbalanced {", "pointwise", "not a template"),
    ],
)
def test_malformed_templates_name_the_field(text, kind, message):
    with pytest.raises(InvalidArgument) as caught:
        JudgeTemplate.parse(text, kind=kind, field="judge_template")
    assert caught.value.field == "judge_template"
    assert message in caught.value.message


def test_missing_metadata_names_the_field():
    template = JudgeTemplate.parse("{completion} vs {reference}", kind="pointwise")
    with pytest.raises(TemplateError, match="metadata 'reference' is required"):
        template.metadata(SAMPLE)


def test_numbered_and_cut_middle():
    assert numbered(["a", "b"]) == "[1] a\n\n[2] b"
    assert cut_middle("short", 10, "characters") is None
    head, tail, marker = cut_middle("abcdefghij", 4, "characters")
    assert (head, tail) == ("ab", "ij")
    assert "6 of 10 characters" in marker
