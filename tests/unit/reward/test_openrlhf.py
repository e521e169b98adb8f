"""OpenRLHF's /get_reward body -> samples without a server: suffix stripping (the same result as cutting one
suffix at a time, in one linear pass), and every item refused at its limit with the index it has."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_runtime.errors import InvalidArgument
from reward_service.core.scorer import ScoreLimits, json_chars
from reward_service.http import openrlhf
from reward_service.http.settings import HttpSettings

SUFFIXES = HttpSettings().strip_suffixes
LIMITS = ScoreLimits(max_completion_chars=1000, max_metadata_chars=100)


def strip_one_at_a_time(completion: str, suffixes: list[str]) -> str:
    """The rule as written: rstrip, cut the first suffix that ends the text, again until none does."""
    text = completion.rstrip()
    while True:
        for suffix in suffixes:
            if suffix and text.endswith(suffix):
                text = text[: -len(suffix)].rstrip()
                break
        else:
            return text


pieces = st.sampled_from([*SUFFIXES, " ", "\n", "\t", "\x1f", "\u3000", "a", "s>", "</", "<|im_", "end|>"])


@settings(max_examples=300)
@given(
    text=st.lists(pieces, max_size=30).map("".join),
    suffixes=st.lists(st.sampled_from([*SUFFIXES, "", " </s>", "</s> ", "s>", "x</s>"]), max_size=5),
)
def test_stripping_matches_cutting_one_suffix_at_a_time(text, suffixes):
    assert openrlhf._strip(text, suffixes) == strip_one_at_a_time(text, suffixes)


def test_stripping_a_long_run_of_suffixes_is_one_pass():
    # Cut one at a time, this run copies 3 MB per suffix 500k times (about 1.5 TB).
    tail = "<|im_end|>\n" * 100_000 + "</s> " * 400_000
    assert openrlhf._strip("the answer" + tail, SUFFIXES) == "the answer"


def columns(body: dict) -> openrlhf.Columns:
    return openrlhf.columns_of(body)


def test_columns_read_no_item():
    # 10**6 items of the wrong type: columns_of is done before any is looked at (the caller checks counts).
    got = columns({"query": [1] * 1_000_000, "labels": [True] * 1_000_000})
    assert len(got.queries) == 1_000_000


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"query": ["a", 2]}, "query[1]", "must be a string"),
        ({"query": ["a", "b"], "prompts": ["a", 3]}, "prompts[1]", "must be a string"),
        ({"query": ["p" + "x" * 1001], "prompts": ["p"]}, "query[0]", "max_completion_chars=1000"),
        ({"query": ["a", "b"], "labels": [None, {"k": "x" * 99}]}, "labels[1]", "max_metadata_chars=100"),
        ({"query": ["a"], "labels": [{"k": [None] * 200}]}, "labels[0]", "max_metadata_chars=100"),
    ],
)
def test_each_item_is_refused_at_its_limit_naming_it(body, field, message):
    with pytest.raises(InvalidArgument, match=message) as error:
        openrlhf.samples_of(columns(body), HttpSettings(), LIMITS)
    assert error.value.field == field


def test_items_at_their_limits_are_samples():
    label = {"k": "x" * 98}
    assert json_chars(label) == LIMITS.max_metadata_chars
    body = {"query": ["p" + "x" * 1000 + "</s>" * 5000], "prompts": ["p"], "labels": [label]}
    with pytest.raises(InvalidArgument, match="max_completion_chars"):  # the suffixes count as sent
        openrlhf.samples_of(columns(body), HttpSettings(), LIMITS)
    body["query"] = ["p" + "x" * 1000]
    [sample] = openrlhf.samples_of(columns(body), HttpSettings(), LIMITS)
    assert sample.completion == "x" * 1000 and sample.metadata == label
