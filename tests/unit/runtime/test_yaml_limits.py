"""``safe_load_yaml``: SafeLoader semantics within size, depth, alias and expansion limits."""

from __future__ import annotations

import asyncio
import time

import pytest

from grpo_runtime.config import (
    ConfigError,
    YamlLimits,
    load_config_file,
    safe_load_yaml,
    safe_load_yaml_async,
)


def _billion_laughs(levels: int = 9) -> str:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        prev, name = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_plain_documents_load_as_safe_load_does():
    assert safe_load_yaml("a: &x [1, 2]\nb: *x\nc: {d: 3.5, e: null}\n") == {
        "a": [1, 2],
        "b": [1, 2],
        "c": {"d": 3.5, "e": None},
    }
    assert safe_load_yaml("") is None
    assert safe_load_yaml(b"k: v\n") == {"k": "v"}


def test_an_alias_bomb_is_refused_quickly():
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^config_yaml: YAML expands to more than 1000000 nodes"):
        safe_load_yaml(_billion_laughs(), what="config_yaml")
    assert time.monotonic() - started < 5  # generous: proves it did not expand the bomb


@pytest.mark.parametrize(
    ("text", "limits", "message"),
    [
        ("[" * 100_000, YamlLimits(), "nested deeper than 64 levels"),
        ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 80)), YamlLimits(), "deeper than 64"),
        ("x" * 101, YamlLimits(max_bytes=100), "YAML of 101 bytes, at most 100"),
        ("- &a x\n" + "- *a\n" * 11, YamlLimits(max_aliases=10), "more than 10 YAML aliases"),
        ("[1, 2, 3, 4]", YamlLimits(max_nodes=4), "expands to more than 4 nodes"),
        ("{a: [}", YamlLimits(), "invalid YAML"),
        (b"\xff\xfe", YamlLimits(), "not UTF-8"),
        ("!!python/object:os.system {}", YamlLimits(), "invalid YAML"),
        ("a: " + "9" * 5000, YamlLimits(), "invalid YAML value: Exceeds the limit (4300 digits)"),
        ("a: 2001-13-45", YamlLimits(), "invalid YAML value: month must be in 1..12"),
        ("a: !!float xyz", YamlLimits(), "invalid YAML value: could not convert string to float"),
    ],
)
def test_limits_and_errors_are_config_errors_naming_the_source(text, limits, message):
    with pytest.raises(ConfigError, match=r"^req\.field: ") as error:
        safe_load_yaml(text, what="req.field", limits=limits)
    assert message in str(error.value)


def test_the_async_variant_parses_in_a_thread_and_raises_the_same_errors():
    assert asyncio.run(safe_load_yaml_async("a: 1")) == {"a": 1}
    with pytest.raises(ConfigError, match="alias bomb"):
        asyncio.run(safe_load_yaml_async(_billion_laughs()))


def test_config_files_go_through_the_limits(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_billion_laughs())
    with pytest.raises(ConfigError, match=rf"^{path}: YAML expands"):
        load_config_file(path)
