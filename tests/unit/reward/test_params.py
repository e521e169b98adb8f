"""Param checking: defaults, overrides, and InvalidArgument naming rewards[i].params.<key>."""

from __future__ import annotations

import pytest

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import ParamInfo
from reward_service.rewards.params import resolve_params

DECLARED = (
    ParamInfo("n", "integer", 3, "", minimum=1),
    ParamInfo("p", "number", -1.0, "", maximum=0),
    ParamInfo("mode", "string", "a", "", choices=("a", "b")),
    ParamInfo("flag", "boolean", False, ""),
)


def test_defaults_and_overrides():
    assert resolve_params(DECLARED, {}, "rewards[0].params") == {
        "n": 3,
        "p": -1.0,
        "mode": "a",
        "flag": False,
    }
    got = resolve_params(DECLARED, {"n": 5.0, "p": -0.5, "mode": "b", "flag": True}, "rewards[0].params")
    assert got == {"n": 5, "p": -0.5, "mode": "b", "flag": True}
    assert isinstance(got["n"], int)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"nope": 1}, "rewards[2].params.nope"),
        ({"n": 1.5}, "rewards[2].params.n"),
        ({"n": 0}, "rewards[2].params.n"),
        ({"n": True}, "rewards[2].params.n"),
        ({"p": 0.5}, "rewards[2].params.p"),
        ({"p": "x"}, "rewards[2].params.p"),
        ({"p": float("nan")}, "rewards[2].params.p"),
        ({"mode": "c"}, "rewards[2].params.mode"),
        ({"flag": 1}, "rewards[2].params.flag"),
    ],
)
def test_bad_params_name_the_field(given, field):
    with pytest.raises(InvalidArgument) as err:
        resolve_params(DECLARED, given, "rewards[2].params")
    assert err.value.field == field


ARRAYS = (
    ParamInfo("targets", "array", None, "", choices=("latex", "expr")),
    ParamInfo("delimiters", "array", ["</think>"], ""),
)


def test_array_params_resolve_to_tuples_of_strings():
    got = resolve_params(ARRAYS, {"targets": ["expr", "latex"], "delimiters": ["</r>"]}, "p")
    assert got == {"targets": ("expr", "latex"), "delimiters": ("</r>",)}
    assert resolve_params(ARRAYS, {}, "p") == {"targets": None, "delimiters": ["</think>"]}


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"targets": ["latex", "text"]}, "p.targets[1]"),
        ({"targets": ["expr", "expr"]}, "p.targets[1]"),
        ({"targets": []}, "p.targets"),
        ({"targets": "latex"}, "p.targets"),
        ({"delimiters": [""]}, "p.delimiters[0]"),
        ({"delimiters": ["a", 1.0]}, "p.delimiters[1]"),
        ({"delimiters": [["</think>"]]}, "p.delimiters[0]"),
        ({"delimiters": ["x" * 1025]}, "p.delimiters[0]"),
        ({"delimiters": [str(i) for i in range(33)]}, "p.delimiters"),
    ],
)
def test_bad_array_params_name_the_item(given, field):
    with pytest.raises(InvalidArgument) as err:
        resolve_params(ARRAYS, given, "p")
    assert err.value.field == field
