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
