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


def overlap_by_every_suffix(prompt: str, query: str) -> int:
    """The rule as written (quadratic): the longest suffix of ``prompt`` that ``query`` starts with."""
    return next(len(prompt) - j for j in range(len(prompt) + 1) if query.startswith(prompt[j:]))


@settings(max_examples=500)
@given(
    prompt=st.text(alphabet="ab\ufffd", max_size=16),
    query=st.text(alphabet="ab\ufffd", max_size=16),
)
def test_prompt_overlap_is_the_longest_suffix_the_query_starts_with(prompt, query):
    assert openrlhf.prompt_overlap(prompt, query) == overlap_by_every_suffix(prompt, query)


def test_prompt_overlap_is_linear_on_periodic_text():
    # Trying each suffix here compares about n²/2 = 5·10¹¹ characters; the KMP match reads each about twice.
    n = 1_000_000
    assert openrlhf.prompt_overlap("a" * n, "a" * (n - 1) + "b") == n - 1
    assert openrlhf.prompt_overlap("ab" * (n // 2), "b" + "ab" * (n // 2 - 1) + "c") == n - 1


def sample_of(query: str, prompt: str, limits: ScoreLimits = LIMITS):
    [sample] = openrlhf.samples_of(columns({"query": [query], "prompts": [prompt]}), HttpSettings(), limits)
    return sample


def left_truncated(prompt: str, kept_bytes: int) -> str:
    """What OpenRLHF 0.11 decodes for a prompt cut to its last tokens, with one token per UTF-8 byte (a
    byte-level BPE at its finest): a cut inside a character decodes as U+FFFD."""
    return prompt.encode()[-kept_bytes:].decode(errors="replace")


PROMPT = "<|im_start|>user\n一加一等于几？ What is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"


# All of it, from 等, from inside 等 (two and one of its three bytes kept: U+FFFD), mid-ASCII, the last byte.
@pytest.mark.parametrize("kept_bytes", [len(PROMPT.encode()), 60, 59, 58, 43, 1])
def test_a_left_truncated_prompt_ends_where_its_kept_tokens_end(kept_bytes):
    sample = sample_of(left_truncated(PROMPT, kept_bytes) + "\\boxed{2}<|im_end|>", PROMPT)
    assert sample.completion == "\\boxed{2}"
    assert sample.prompt[0].content == PROMPT  # the rewards see the prompt as sent


def test_a_query_sharing_no_text_with_its_prompt_is_refused():
    with pytest.raises(InvalidArgument, match="starts with no suffix of prompts") as error:
        openrlhf.samples_of(
            columns({"query": [PROMPT + "x", "\\boxed{2}"], "prompts": [PROMPT, PROMPT]}),
            HttpSettings(),
            LIMITS,
        )
    assert error.value.field == "query[1]"


@pytest.mark.parametrize(
    ("query", "prompt", "field", "message"),
    [
        # The prompt's size is checked before it is matched.
        ("a", "p" * 101, "prompts[0]", "max_prompt_chars=100"),
        # Past the limit even if the whole prompt matched: refused before matching.
        ("x" * 1011, "p" * 10, "query[0]", "1001 characters after its prompt"),
        # Within it only as sent; what follows the matched suffix is longer.
        ("p" + "x" * 1005, "q" * 8 + "p", "query[0]", "1005 characters after the end of its prompt"),
    ],
)
def test_truncated_prompts_are_checked_at_the_limits(query, prompt, field, message):
    with pytest.raises(InvalidArgument, match=message) as error:
        sample_of(query, prompt, ScoreLimits(max_completion_chars=1000, max_prompt_chars=100))
    assert error.value.field == field
