"""Caller-named paths resolved before they are judged against the allowed directories."""

import pytest

from grpo_runtime.paths import is_within, resolve_path


def test_symlink_and_parent_steps_are_judged_where_they_lead(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    assert is_within(resolve_path("a/b", root), [root.resolve()])
    assert not is_within(resolve_path("link/x", root), [root.resolve()])
    assert not is_within(resolve_path("../outside", root), [root.resolve()])
    assert is_within(resolve_path(outside), [root.resolve(), outside.resolve()])


def test_unresolvable_paths_say_why(tmp_path):
    with pytest.raises(ValueError, match="NUL"):
        resolve_path("a\x00b", tmp_path)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ValueError, match="cannot be resolved"):
        resolve_path("loop/x", tmp_path)
