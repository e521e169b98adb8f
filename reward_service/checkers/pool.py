"""A pool of checker worker processes (math-verify, JSON schema, reasoning-gym scoring) with a hard
per-sample deadline and a memory limit.

Why processes: math-verify's timeouts use ``SIGALRM`` and only work in the main thread of the main
interpreter, and SymPy can hang inside C code where no signal helps. Each worker is a ``spawn``-ed process
(never ``fork``: gRPC is not fork-safe) that runs ``worker.serve`` in its main thread, so math-verify's own
timeouts work there. On top of that every sample has a hard deadline: a worker that overruns it is killed and
replaced (the pool returns to full size once the new process is ready), and the sample gets
``error="exceeded the per-sample deadline of Xs ..."`` — never a silent 0, and no orphaned SymPy work. A job
that allocates more than ``memory_mb`` past the worker's start-up footprint gets MemoryError in the worker
(an error naming the limit) instead of growing the host's memory use. The same workers validate completions
against user-supplied JSON schemas, whose regular expressions can backtrack without bound, and run
reasoning-gym's scoring code on caller metadata: any module-level function can be a job (``run``; see
``worker``).

Jobs of several items (``run_many``, ``check_many``): a job carries up to ``MAX_JOB_ITEMS`` argument tuples of
one function, travels to its worker in one pipe write and is answered item by item, so the G completions of a
group cost one hop instead of G and meet the same worker's caches. Each item keeps its own deadline (from the
moment its worker starts it) and its own result. A kill costs the other items of its job nothing but a wait:
the items answered before the overrunning one keep their results, the overrunning one gets the deadline error
(as a job of one item would), and the items after it go back to the front of the queue and run on the
replacement worker (or another one).

Scheduling: a sample waits in the queue of the worker its gold answer hashes to, so the G completions of a
group meet that worker's caches (parsed gold, verdicts; see ``worker``); a worker whose own queue is empty
takes work (a whole job) from the longest other queue, so a batch still spreads over every core. One driver
coroutine per worker keeps up to ``PIPELINE_DEPTH`` jobs in that worker's pipe, so a worker starts its next
job as soon as it finishes one instead of waiting for this (busy) event loop to hand it over. A sample's
deadline runs from the moment its worker starts it (when the sample before it finished). When a worker is
killed, the samples queued behind the overrunning one go back to the front of its queue.

Start the pool before the gRPC server (``await pool.start()``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import multiprocessing
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, cast

from reward_service.checkers import json_schema, worker
from reward_service.checkers.options import TRL, MathVerifyOptions
from reward_service.checkers.settings import CheckerSettings

log = logging.getLogger(__name__)

_CONTEXT = multiprocessing.get_context("spawn")
STARTUP_TIMEOUT_S = 120.0
PIPELINE_DEPTH = 2
# Items of one job at most: one pipe round trip and one worker's caches for a GRPO group's completions
# (G is typically 8 to 16), while a batch of groups still spreads over every worker.
MAX_JOB_ITEMS = 8
# Jobs larger than this are only written to an idle worker: a socketpair holds at least this much, so a
# smaller write never blocks the event loop.
PIPE_BUFFER_BYTES = 32 * 1024
# A sample whose caller went away (cancelled or expired Score) may finish within this many seconds;
# after that its worker is killed and replaced rather than left computing for nobody.
ABANDONED_GRACE_S = 1.0


class _Abandoned(Exception):
    """The caller of the sample in progress went away."""


@dataclass
class _Job:
    """``function(*args)`` for each args of ``items``, answered in order by one worker."""

    function: Callable[..., worker.Result]
    items: list[tuple[Any, ...]]
    results: list[asyncio.Future[worker.Result]] = field(repr=False)
    deadline_s: float  # of each item
    answered: int = 0  # items whose reply arrived
    payload: bytes = field(init=False, repr=False)  # the pickled ``(function, items)``, see ``worker.serve``

    def __post_init__(self) -> None:
        self.payload = pickle.dumps((self.function, self.items), protocol=pickle.HIGHEST_PROTOCOL)

    @property
    def current(self) -> asyncio.Future[worker.Result]:
        """The result of the item the worker computes (or will compute) next."""
        return self.results[self.answered]

    def wanted(self) -> bool:
        """Whether a caller still waits for one of the items not yet answered."""
        return not all(r.done() for r in self.results[self.answered :])

    def rest(self) -> _Job | None:
        """The items after the current one, as a job of their own (None when there are none)."""
        after = self.answered + 1
        if after >= len(self.items):
            return None
        return _Job(self.function, self.items[after:], self.results[after:], self.deadline_s)

    def close(self, error: str) -> None:
        """Gives every item still waiting ``(None, error)``."""
        for result in self.results[self.answered :]:
            if not result.done():
                result.set_result((None, error))


def _set_once(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _kill_started(spawn: asyncio.Future[_Worker]) -> None:
    """Kills the worker a cancelled start produced after all (if it did)."""
    if not spawn.cancelled() and spawn.exception() is None:
        spawn.result().kill()


class _Worker:
    def __init__(self, settings: CheckerSettings):
        self.conn, child = _CONTEXT.Pipe()
        self.process: BaseProcess = _CONTEXT.Process(
            target=worker.serve,
            args=(child, settings.niceness, settings.memory_mb),
            daemon=True,
            name="checker-worker",
        )
        self.process.start()
        child.close()

    async def receive(self, timeout: float | None, abandoned: asyncio.Future[Any] | None = None) -> object:
        """Waits for the next message without blocking the event loop; TimeoutError past ``timeout``,
        _Abandoned as soon as ``abandoned`` (the awaited job's result) is done without it."""
        if not self.conn.poll():
            loop = asyncio.get_running_loop()
            ready = loop.create_future()
            fd = self.conn.fileno()
            loop.add_reader(fd, _set_once, ready)
            waiting: set[asyncio.Future[Any]] = {ready} if abandoned is None else {ready, abandoned}
            try:
                await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                loop.remove_reader(fd)
                ready.cancel()
            if not self.conn.poll():
                if abandoned is not None and abandoned.done():
                    raise _Abandoned
                raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class CheckerPool:
    """``await pool.run(function, *args, key=...)`` → ``(value, error)`` computed in a worker process
    (``run_many``: a list of them); ``check``/``check_many`` (math-verify) and ``check_json_schema`` are
    such jobs."""

    def __init__(self, settings: CheckerSettings):
        self.settings = settings
        self._queues: list[collections.deque[_Job]] = [collections.deque() for _ in range(settings.workers)]
        self._job_ready = asyncio.Event()
        self._drivers: list[asyncio.Task[None]] = []
        self._workers: list[_Worker | None] = []
        self._closed = False
        self._reaping: set[asyncio.Future[None]] = set()
        self._standby: asyncio.Future[_Worker] | None = None
        self.replaced = 0  # workers killed for overrunning or crashing (for tests and metrics)

    @property
    def size(self) -> int:
        return self.settings.workers

    @property
    def alive(self) -> int:
        """Workers started and answering (a replaced one counts again once it is ready)."""
        return sum(w is not None for w in self._workers)

    @property
    def standby_ready(self) -> bool:
        """Whether a started replacement waits for the next killed worker."""
        return self._standby is not None and self._standby.done() and not self._standby.exception()

    async def start(self) -> None:
        """Starts every worker (and the standby) and waits until each has imported math-verify."""
        workers = await asyncio.gather(*(self._new_worker() for _ in range(self.settings.workers)))
        self._workers = list(workers)
        self._drivers = [asyncio.ensure_future(self._drive(i)) for i in range(len(workers))]
        self._start_standby()
        log.info("checker pool: %d worker processes", len(workers))

    def _start_standby(self) -> None:
        """Spawns the next replacement ahead of need (``standby`` setting), so that a killed worker's slot
        is serving again at once instead of after a spawn and a math-verify import (seconds)."""
        if self.settings.standby and not self._closed:
            self._standby = asyncio.ensure_future(self._new_worker())

    async def _replacement(self) -> _Worker:
        standby, self._standby = self._standby, None
        if standby is not None:
            try:
                w = await asyncio.shield(standby)
            except asyncio.CancelledError:
                self._standby = standby  # still starting: close() collects it
                raise
            except Exception:
                log.exception("checker standby worker failed to start; spawning another")
            else:
                self._start_standby()
                return w
        w = await self._new_worker()
        self._start_standby()
        return w

    async def _new_worker(self) -> _Worker:
        # Spawning forks this (large) process: seconds on a loaded machine, so not on the event loop.
        spawn = asyncio.ensure_future(asyncio.to_thread(_Worker, self.settings))
        try:
            w = await asyncio.shield(spawn)
        except asyncio.CancelledError:  # the thread still finishes: kill what it starts
            spawn.add_done_callback(_kill_started)
            raise
        try:
            if await w.receive(STARTUP_TIMEOUT_S) != "ready":
                raise RuntimeError("checker worker sent an unexpected greeting")
        except BaseException:
            w.kill()
            raise
        return w

    async def check(
        self,
        gold: str,
        completion: str,
        deadline_s: float | None = None,
        options: MathVerifyOptions = TRL,
    ) -> tuple[float | None, str]:
        """Verifies one completion against its gold answer with ``options``' extraction and comparison;
        see ``worker.check_answer``."""
        [result] = await self.check_many(gold, [completion], deadline_s, options)
        return result

    async def check_many(
        self,
        gold: str,
        completions: Sequence[str],
        deadline_s: float | None = None,
        options: MathVerifyOptions = TRL,
    ) -> list[tuple[float | None, str]]:
        """``check`` of each completion against one gold, in jobs of up to ``MAX_JOB_ITEMS`` completions
        (a group's completions: one hop per job, one worker's parsed gold and verdicts)."""
        timeouts = (self.settings.parse_timeout_s, self.settings.verify_timeout_s)
        items = [(gold, completion, *timeouts, options) for completion in completions]
        return await self.run_many(worker.check_answer, items, key=gold, deadline_s=deadline_s)

    async def check_json_schema(
        self, schema: Any, completion: str, partial: bool, deadline_s: float | None = None
    ) -> tuple[float | None, str]:
        """Validates one completion against a sample's schema; see ``json_schema.check_completion``."""
        return await self.run(
            json_schema.check_json_schema, schema, completion, partial, key=completion, deadline_s=deadline_s
        )

    async def run(
        self,
        function: Callable[..., tuple[float | None, str]],
        *args: Any,
        key: str,
        deadline_s: float | None = None,
    ) -> tuple[float | None, str]:
        """``function(*args)`` in a worker process, within ``deadline_s`` (default: the ``deadline_s``
        setting) from the moment the worker starts it. ``function`` is a module-level function (it pickles
        by name) returning ``(value, error)``; its arguments pickle by value. Jobs of equal ``key`` wait in
        the same worker's queue, so they meet that worker's caches."""
        [result] = await self.run_many(function, [args], key=key, deadline_s=deadline_s)
        return result

    async def run_many(
        self,
        function: Callable[..., tuple[float | None, str]],
        items: Sequence[tuple[Any, ...]],
        *,
        key: str,
        deadline_s: float | None = None,
    ) -> list[tuple[float | None, str]]:
        """``run(function, *args)`` for each args of ``items``, results in their order: jobs of up to
        ``MAX_JOB_ITEMS`` items, each sent to one worker in one pipe write (see the module docstring for
        what a kill costs a job's other items)."""
        if self._closed:
            raise RuntimeError("checker pool is closed")
        loop = asyncio.get_running_loop()
        results: list[asyncio.Future[worker.Result]] = [loop.create_future() for _ in items]
        queue = self._queues[hash(key) % len(self._queues)]
        deadline_s = deadline_s or self.settings.deadline_s
        for start in range(0, len(items), MAX_JOB_ITEMS):
            end = start + MAX_JOB_ITEMS
            queue.append(_Job(function, list(items[start:end]), results[start:end], deadline_s))
        self._job_ready.set()
        return list(await asyncio.gather(*results))

    def _take(self, slot: int) -> _Job | None:
        """The next wanted job of ``slot``'s own queue, else of the longest other queue."""
        own = self._queues[slot]
        while True:
            queue = own if own else max(self._queues, key=len)
            if not queue:
                return None
            job = queue.popleft()
            if job.wanted():  # skip jobs whose callers went away
                return job

    async def _next_job(self, slot: int, wait: bool) -> _Job | None:
        while True:
            job = self._take(slot)
            if job is not None or not wait:
                return job
            self._job_ready.clear()
            await self._job_ready.wait()

    async def _drive(self, slot: int) -> None:
        """Feeds worker ``slot`` from the shared queue, enforces deadlines, replaces it when it overruns."""
        in_pipe: collections.deque[_Job] = collections.deque()
        try:
            await self._drive_loop(slot, in_pipe)
        finally:
            for job in in_pipe:
                job.close("checker pool closed")

    async def _drive_loop(self, slot: int, in_pipe: collections.deque[_Job]) -> None:
        head_started = 0.0
        # Seconds the head item may take from head_started: its deadline, or STARTUP_TIMEOUT_S while the
        # worker imports a job module at first use (worker.IMPORTING ... worker.IMPORTED).
        allowed = 0.0
        while not self._closed:
            w = self._workers[slot]
            if w is None:
                try:
                    w = self._workers[slot] = await self._replacement()
                except Exception:
                    log.exception("could not replace checker worker %d; retrying", slot)
                    await asyncio.sleep(1.0)
                    continue
            if not in_pipe:
                job = await self._next_job(slot, wait=True)
                assert job is not None
                head_started, allowed = time.monotonic(), job.deadline_s
                if not self._send(w, job, in_pipe):
                    self._retire(slot, in_pipe, "verification worker died")
                    continue
            while (
                len(in_pipe) < PIPELINE_DEPTH and (job := await self._next_job(slot, wait=False)) is not None
            ):
                if len(job.payload) > PIPE_BUFFER_BYTES:
                    # Writing it now would block the event loop until the busy worker reads it; it goes
                    # when the worker is idle (in_pipe empty) and reads as fast as it is written.
                    self._queues[slot].appendleft(job)
                    break
                if not self._send(w, job, in_pipe):
                    break
            head = in_pipe[0]
            remaining = allowed - (time.monotonic() - head_started)
            try:
                try:
                    reply = await w.receive(max(remaining, 0.0), abandoned=head.current)
                except _Abandoned:
                    reply = await w.receive(min(max(remaining, 0.0), ABANDONED_GRACE_S))
                if reply in (worker.IMPORTING, worker.IMPORTED):
                    # The import is no part of the item's deadline: its clock starts again after it.
                    head_started = time.monotonic()
                    allowed = STARTUP_TIMEOUT_S if reply == worker.IMPORTING else head.deadline_s
                    continue
                value, error = cast(worker.Result, reply)
            except TimeoutError:
                self._retire(
                    slot,
                    in_pipe,
                    f"exceeded the per-sample deadline of {head.deadline_s:g}s (checkers.deadline_s); "
                    "its worker was killed and replaced",
                    value=self.settings.timeout_value,
                )
                continue
            except (EOFError, OSError):
                self._retire(slot, in_pipe, "verification worker died")
                continue
            result = head.current
            head.answered += 1
            if head.answered == len(head.items):
                in_pipe.popleft()
            head_started, allowed = time.monotonic(), in_pipe[0].deadline_s if in_pipe else 0.0
            if not result.done():
                result.set_result((value, error))

    @staticmethod
    def _send(w: _Worker, job: _Job, in_pipe: collections.deque[_Job]) -> bool:
        in_pipe.append(job)
        try:
            w.conn.send_bytes(job.payload)
        except OSError:
            return False
        return True

    def _retire(
        self, slot: int, in_pipe: collections.deque[_Job], error: str, value: float | None = None
    ) -> None:
        """Kills worker ``slot``: its current sample gets ``(value, error)``, the ones behind it (the rest
        of its job, then the other jobs in its pipe) are re-queued."""
        w = self._workers[slot]
        self._workers[slot] = None
        if w is not None:
            reaping = asyncio.ensure_future(asyncio.to_thread(w.kill))  # join() blocks: off the loop
            self._reaping.add(reaping)
            reaping.add_done_callback(self._reaping.discard)
        self.replaced += 1
        head = in_pipe.popleft()
        if not head.current.done():
            head.current.set_result((value, error))
        rest = head.rest()
        if rest is not None:
            in_pipe.appendleft(rest)
        while in_pipe:
            self._queues[slot].appendleft(in_pipe.pop())
        self._job_ready.set()

    async def close(self) -> None:
        self._closed = True
        for task in self._drivers:
            task.cancel()
        await asyncio.gather(*self._drivers, *self._reaping, return_exceptions=True)
        workers = [w for w in self._workers if w is not None]
        if self._standby is not None:
            standby, self._standby = self._standby, None
            with contextlib.suppress(Exception):
                workers.append(await standby)
        for w in workers:
            with contextlib.suppress(Exception):
                w.conn.send(None)
        await asyncio.gather(*(asyncio.to_thread(w.process.join, 2) for w in workers))
        for w in workers:
            w.kill()
        self._workers = []
        for queue in self._queues:
            for job in queue:
                job.close("checker pool closed")
            queue.clear()
