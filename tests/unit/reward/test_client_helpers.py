"""The TRL side of the client without a server: batch → samples, JSON-safe columns, spec forms."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from reward_service.client import json_safe, to_reward_request, trl_samples
from reward_service.core.types import RewardRequest


def test_trl_batch_to_samples():
    prompts = [[{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]] * 2 + [
        [{"role": "user", "content": "q2"}]
    ]
    completions = [[{"role": "assistant", "content": f"c{i}"}] for i in range(3)]
    samples = trl_samples(
        prompts,
        completions,
        [[1, 2], [3], []],
        {"answer": ["1", "1", "2"], "trainer_state": object(), "short": ["only one"], "scalar": 3},
    )
    assert [s.completion for s in samples] == ["c0", "c1", "c2"]
    assert samples[0].prompt[0].role == "system" and samples[2].prompt[0].content == "q2"
    assert samples[0].completion_ids == (1, 2)
    assert [s.metadata for s in samples] == [{"answer": "1"}, {"answer": "1"}, {"answer": "2"}]
    assert samples[0].group == samples[1].group != samples[2].group


def test_vision_rows_send_their_text_and_keep_their_pictures():
    """A vision row's prompt parts reach the reward service as text; the image columns stay behind."""
    picture = Image.new("RGB", (8, 8))
    parts = [{"type": "image", "image": picture, "text": None}, {"type": "text", "text": "How many?"}]
    prompts = [
        [
            {"role": "system", "content": [{"type": "text", "text": "Count."}]},
            {"role": "user", "content": parts},
        ]
    ]
    columns = {"image": [picture], "images": [[picture]], "answer": ["2"]}
    [sample] = trl_samples(prompts, ["2"], None, columns)
    assert [(m.role, m.content) for m in sample.prompt] == [("system", "Count."), ("user", "How many?")]
    assert sample.metadata == {"answer": "2"}


def test_plain_strings_and_repeated_prompt_later_is_a_new_group():
    samples = trl_samples(["a", "a", "b", "a"], ["x", "y", "z", "w"], None, {})
    assert samples[0].prompt[0].role == "user" and samples[0].prompt[0].content == "a"
    groups = [s.group for s in samples]
    assert groups[0] == groups[1] and len(set(groups)) == 3


def test_json_safe():
    value = {"a": np.int64(3), "b": np.array([1.5, 2.0]), "c": float("nan"), "d": (1, "x"), 4: {1, 2}}
    assert json_safe(value) == {"a": 3, "b": [1.5, 2.0], "c": None, "d": [1, "x"], "4": [1, 2]}
    assert json_safe(object()).startswith("<object")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("accuracy", RewardRequest("accuracy")),
        (("format", 0.5), RewardRequest("format", 0.5)),
        (("cosine", 2, {"max_len": 10}), RewardRequest("cosine", 2.0, {"max_len": 10})),
        (RewardRequest("x", 3.0), RewardRequest("x", 3.0)),
    ],
)
def test_reward_specs(spec, expected):
    assert to_reward_request(spec) == expected
