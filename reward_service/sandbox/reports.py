"""The host's side of ``launcher.py``'s reports: one per test, read and checked as they arrive.

Wire format (launcher.py writes it): a JSON line ``{"status", "limit", "cpu_s", "cpu_limit_s", "wall_s",
"out", "err"}`` then ``out`` bytes of the program's stdout and ``err`` bytes of the end of its stderr. The
launcher is the service's own code, but it shares the sandbox with the program, so every field is checked
against the run's caps before anything is read on its word.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from reward_service.sandbox.backends import RunBatch

# Longest header line accepted (bytes); a real one is about 150.
HEADER_BYTES = 1024
LIMITS = ("", "wall", "output", "cpu")


class BadReport(Exception):
    """The launcher's output is not a report of the run's tests."""


@dataclass(frozen=True)
class TestReport:
    """One test as the launcher saw it: wait status (None: never reaped), the limit that ended it, CPU and
    wall seconds, its RLIMIT_CPU, the head of its stdout and the tail of its stderr."""

    status: int | None
    limit: str
    cpu_s: float
    cpu_limit_s: int
    wall_s: float
    stdout: bytes
    stderr_tail: bytes

    @property
    def killed(self) -> bool:
        """Ended by the launcher (its CPU allowance is charged whole, as for a run the host kills)."""
        return self.limit in ("wall", "output")


def _seconds(header: dict, key: str) -> float:
    value = header.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BadReport(f"{key}: {value!r}")
    return float(value)


def _count(header: dict, key: str, low: int, high: int) -> int:
    value = header.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadReport(f"{key}: {value!r}")
    return value


def parse_header(line: bytes, batch: RunBatch) -> dict:
    """The header of one report, every field checked against ``batch``'s caps; BadReport if not."""
    try:
        header = json.loads(line)
    except ValueError as exc:
        raise BadReport("header is not JSON") from exc
    if not isinstance(header, dict) or header.get("limit") not in LIMITS:
        raise BadReport(f"header: {line[:80]!r}")
    if header.get("status") is not None:
        _count(header, "status", 0, 0xFFFF)
    _seconds(header, "cpu_s")
    _seconds(header, "wall_s")
    _count(header, "cpu_limit_s", 1, max(batch.limits.cpu_s, math.ceil(batch.cpu_time_s)))
    _count(header, "out", 0, batch.max_output_bytes)
    _count(header, "err", 0, batch.tail_bytes)
    return header


async def read_reports(
    stream: asyncio.StreamReader, batch: RunBatch, on_report: Callable[[TestReport], None]
) -> None:
    """Reads reports until end of file or one per test of ``batch``; BadReport (or the stream's own
    errors) on anything else. ``stream``'s limit must be at least HEADER_BYTES."""
    for _ in batch.inputs:
        try:
            line = await stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise BadReport("output ends inside a header") from exc
            return
        except asyncio.LimitOverrunError as exc:
            raise BadReport("header too long") from exc
        header = parse_header(line, batch)
        try:
            data = await stream.readexactly(header["out"] + header["err"])
        except asyncio.IncompleteReadError as exc:
            raise BadReport("output ends inside a report") from exc
        on_report(
            TestReport(
                status=header["status"],
                limit=header["limit"],
                cpu_s=header["cpu_s"],
                cpu_limit_s=header["cpu_limit_s"],
                wall_s=header["wall_s"],
                stdout=data[: header["out"]],
                stderr_tail=data[header["out"] :],
            )
        )
