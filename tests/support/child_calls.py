"""Calls run in a child process that is killed when one runs past a generous bound.

A blow-up in C code (a huge integer power) holds the GIL and checks no signal, so neither a thread nor an
alarm of the test process could stop it: only a separate process can be given up on. The child is
``spawn``-ed (the test process may hold gRPC threads) and replaced after a kill.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

_CONTEXT = multiprocessing.get_context("spawn")


class Overran(Exception):
    """A call did not finish within its bound; its child was killed."""


def _serve(conn: Any) -> None:
    while True:
        job = conn.recv()
        if job is None:
            return
        function, args = job
        try:
            conn.send(("returned", function(*args)))
        except Exception as exc:
            conn.send(("raised", exc))


class ChildCalls:
    """``call(function, *args, timeout_s=...)`` → ``("returned", value)`` or ``("raised", exception)``
    from a child process; Overran when it takes longer than ``timeout_s``."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._conn, child = _CONTEXT.Pipe()
        self._process = _CONTEXT.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()

    def call(self, function: Callable[..., Any], *args: Any, timeout_s: float) -> tuple[str, Any]:
        self._conn.send((function, args))
        if not self._conn.poll(timeout_s):
            self._kill()
            self._start()
            raise Overran(f"{function.__name__}{args!r} ran past {timeout_s:g}s")
        return self._conn.recv()

    def _kill(self) -> None:
        self._process.kill()
        self._process.join(timeout=10)
        self._conn.close()

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(timeout=10)
        self._kill()
