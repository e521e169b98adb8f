"""Caller-named files are read only as regular files under the allowed root, never blocking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_runtime.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from rollout_service.confined_files import confined_directory, read_confined


@pytest.fixture
def root(tmp_path) -> Path:
    root = (tmp_path / "root").resolve()
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "a.bin").write_bytes(b"abc")
    (tmp_path / "secret.bin").write_bytes(b"secret")
    return root


def test_a_regular_file_under_the_root_is_read(root):
    assert bytes(read_confined(root, root / "weights" / "a.bin", 10, "path")) == b"abc"
    inside = root / "weights" / "link.bin"
    inside.symlink_to(root / "weights" / "a.bin")  # a symlink that stays inside is fine
    assert bytes(read_confined(root, inside, 10, "path")) == b"abc"


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../secret.bin", "weights/../../secret.bin", "/dev/zero"],
)
def test_paths_outside_the_root_are_permission_denied(root, path):
    with pytest.raises(PermissionDenied) as info:
        read_confined(root, Path(path), 10, "path")
    assert info.value.field == "path"


def test_symlinks_out_of_the_root_are_permission_denied(root):
    (root / "weights" / "out.bin").symlink_to(root.parent / "secret.bin")
    (root / "zero").symlink_to("/dev/zero")
    (root / "etc").symlink_to("/etc")
    for path in (root / "weights" / "out.bin", root / "zero", root / "etc" / "passwd"):
        with pytest.raises(PermissionDenied):
            read_confined(root, path, 10, "path")
    with pytest.raises(PermissionDenied):
        confined_directory(root, "etc", "path")


def test_fifos_directories_and_devices_are_refused_without_blocking(root):
    fifo = root / "weights" / "fifo.safetensors"
    os.mkfifo(fifo)  # open() without O_NONBLOCK would wait for a writer forever
    with pytest.raises(InvalidArgument, match="not a regular file"):
        read_confined(root, fifo, 10, "path")
    with pytest.raises(InvalidArgument, match="not a regular file"):
        read_confined(root, root / "weights", 10, "path")
    with pytest.raises(InvalidArgument, match="not a directory"):
        confined_directory(root, "weights/a.bin", "path")


def test_a_device_under_the_root_is_refused():
    with pytest.raises(InvalidArgument, match="not a regular file"):
        read_confined(Path("/dev"), Path("/dev/zero"), 10, "path")  # a root that holds devices


def test_files_over_the_cap_are_resource_exhausted_and_odd_paths_invalid(root):
    with pytest.raises(ResourceExhausted, match="max_weight_bytes"):
        read_confined(root, root / "weights" / "a.bin", 2, "path")
    for path in ("", "a\x00b"):
        with pytest.raises(InvalidArgument):
            confined_directory(root, path, "path")
    with pytest.raises(InvalidArgument):
        read_confined(root, root / "weights" / "missing.bin", 10, "path")
