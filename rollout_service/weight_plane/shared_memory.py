"""Buckets as files of a memory-backed directory both processes see (``/dev/shm``, a Kubernetes
``emptyDir`` with ``medium: Memory``).

The trainer writes each bucket into a file there (:class:`BucketFiles`) and the replica maps it
(:class:`SharedMemoryDir`). A random token file, written by the replica at start, lets a trainer tell
that it really sees the same directory (:func:`shares_directory`).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import secrets
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo_runtime.errors import InvalidArgument
from rollout_service.confined_files import open_confined
from rollout_service.weight_plane.buckets import BucketPlan, fill_bucket
from rollout_service.weight_plane.manifest import ChannelManifest

TOKEN_PREFIX = ".grpo-weight-shm-"
# Bucket file names: a plain name, no path separator, no leading dot (the token file's).
_BUCKET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


@dataclass
class SharedMemoryDir:
    """The replica's shared-memory directory and the token file that identifies it.

    ``open`` writes ``<dir>/.grpo-weight-shm-<token>`` holding the token; a trainer that finds
    that file with that content sees the same memory (:func:`shares_directory`).
    """

    directory: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    # Bucket file name → ((device, inode, size), its mapping): the trainer overwrites the same files from push
    # to push, and mapping 1 GB again costs ~0.3 s of page-table work on a busy machine. Only the last push's
    # files stay mapped, and none once the channel closes (a mapping pins a deleted file's memory).
    _mapped: dict[str, tuple[tuple[int, int, int], torch.Tensor]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, directory: str | Path) -> SharedMemoryDir:
        path = Path(directory).resolve()
        path.mkdir(parents=True, exist_ok=True)
        shm = cls(path)
        shm.token_file.write_text(shm.token)
        return shm

    @property
    def token_file(self) -> Path:
        return self.directory / f"{TOKEN_PREFIX}{self.token}"

    def close(self) -> None:
        self.release()
        self.token_file.unlink(missing_ok=True)

    def map_buckets(self, manifest: ChannelManifest) -> list[torch.Tensor]:
        """Map every bucket file read-only (blocking: run in a thread); views as flat uint8 tensors.

        Each name must be a plain file name (no ``/``, ``..``, leading dot) of a regular file, not a
        symlink, directly in the directory, with no other hard link, of exactly the declared size."""
        files = manifest.bucket_files
        if len(files) != len(manifest.bucket_bytes):
            raise InvalidArgument(
                f"{len(files)} bucket files for {len(manifest.bucket_bytes)} buckets", field="bucket_files"
            )
        for i, name in enumerate(files):
            if not _BUCKET_NAME.fullmatch(name):
                raise InvalidArgument(
                    f"{name!r} is not a plain file name in the shared-memory directory",
                    field=f"bucket_files[{i}]",
                )
        buckets = [self._map(i, name, manifest.bucket_bytes[i]) for i, name in enumerate(files)]
        self._mapped = {name: self._mapped[name] for name in files}
        return buckets

    def release(self) -> None:
        """Forget every mapping (they go once no tensor views them)."""
        self._mapped = {}

    def _map(self, i: int, name: str, size: int) -> torch.Tensor:
        where = f"bucket_files[{i}]"
        path = self.directory / name
        if path.is_symlink():  # the sender writes regular files; a link is someone else's doing
            raise InvalidArgument(f"{name!r} is a symbolic link", field=where)
        fd, info = open_confined(self.directory, path, where)
        try:
            # A second name may be one in another directory of the same file system (another process's
            # /dev/shm segment): the directory's confinement would not hold for the file's contents.
            if info.st_nlink != 1:
                raise InvalidArgument(
                    f"{name!r} has {info.st_nlink} hard links; a bucket file has exactly one", field=where
                )
            if info.st_size != size:
                raise InvalidArgument(f"{name!r} has {info.st_size} bytes, the bucket {size}", field=where)
            identity = (info.st_dev, info.st_ino, size)
            cached = self._mapped.get(name)
            if cached is not None and cached[0] == identity:
                return cached[1]
            # MAP_POPULATE maps every page now, in this thread, instead of faulting them one by one.
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
        except OSError as exc:
            raise InvalidArgument(f"cannot map {name!r} ({exc.strerror})", field=where) from exc
        finally:
            os.close(fd)
        # Read-only memory viewed as a tensor: nothing here writes to it (torch warns that it could).
        bucket = _readonly_tensor(mapped)
        self._mapped[name] = (identity, bucket)
        return bucket


def _readonly_tensor(mapped: mmap.mmap) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(mapped, dtype=torch.uint8)


def shares_directory(directory: str | Path, token: str) -> bool:
    """Whether ``directory`` as this process sees it holds the replica's token file with ``token``."""
    if not token or not re.fullmatch(r"[0-9a-f]{1,64}", token):
        return False
    try:
        return (Path(directory) / f"{TOKEN_PREFIX}{token}").read_text() == token
    except OSError:
        return False


class BucketFiles:
    """The sending side of shared memory: bucket files in ``directory``, kept and overwritten from
    push to push (writing into fresh tmpfs pages costs a page fault each, ~1 GB/s here; into
    pages already there it is a plain copy, ~10 GB/s) and deleted by :meth:`close`.

    ``prefix`` tells this sender's files from others' in a shared directory.
    """

    def __init__(self, directory: str | Path, prefix: str | None = None) -> None:
        self.directory = Path(directory)
        self.prefix = prefix or f"weights-{os.getpid()}-{secrets.token_hex(4)}"
        self._maps: list[tuple[Path, mmap.mmap]] = []

    def write(self, tensors: Mapping[str, torch.Tensor], plan: BucketPlan) -> tuple[str, ...]:
        """Write every bucket of ``plan``; returns the file names, in bucket order."""
        self._resize(plan.bucket_bytes)
        for index, (_, mapped) in enumerate(self._maps):
            fill_bucket(torch.frombuffer(mapped, dtype=torch.uint8), plan, index, tensors)
        return tuple(path.name for path, _ in self._maps)

    def _resize(self, sizes: Sequence[int]) -> None:
        if [len(m) for _, m in self._maps] == list(sizes):
            return
        self.close()
        # Refuse at once when the directory cannot hold them: reserving pages until ENOSPC costs about a
        # second per GB before the stream push even starts. fallocate below stays the guarantee.
        stats = os.statvfs(self.directory)
        free = stats.f_bavail * stats.f_frsize
        if free < sum(sizes):
            raise OSError(errno.ENOSPC, f"{sum(sizes)} bytes of buckets, {free} free", str(self.directory))
        for index, size in enumerate(sizes):
            path = self.directory / f"{self.prefix}-{index}.bucket"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                # Reserve the memory now: a write into a mapping the tmpfs has no room for is SIGBUS,
                # while fallocate fails with ENOSPC (an OSError the sender turns into a stream push).
                os.posix_fallocate(fd, 0, size)
                self._maps.append((path, mmap.mmap(fd, size)))
            except OSError:
                path.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)

    def close(self) -> None:
        """Delete the files (their memory is freed once the replicas unmapped them too)."""
        maps, self._maps = self._maps, []
        for path, mapped in maps:
            path.unlink(missing_ok=True)
            # A tensor still viewing the mapping keeps it until that tensor goes.
            with contextlib.suppress(BufferError):
                mapped.close()
