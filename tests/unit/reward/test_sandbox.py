"""The code sandbox: scoring, caps, fair sharing, excerpts (hostile programs: test_sandbox_hostile.py)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from reward_service.core.types import Sample
from reward_service.rewards.code import CodeReward, extract_program, same_output
from reward_service.rewards.params import resolve_params
from reward_service.sandbox.fair import FairSlots
from reward_service.sandbox.runner import SandboxRunner, excerpt, open_runner
from reward_service.sandbox.settings import SandboxSettings

SETTINGS = SandboxSettings(wall_timeout_s=2.0, cpu_time_s=2, memory_mb=256, concurrency=4)


def _fenced(program: str) -> str:
    return f"Here is my solution:\n```python\n{program}\n```\n"


@pytest.fixture(scope="module")
def namespaces_available() -> bool:
    runner, status = asyncio.run(open_runner(SETTINGS))
    assert runner is not None, f"these tests need bubblewrap and user namespaces: {status}"
    return True


def _runner() -> SandboxRunner:
    return SandboxRunner(SETTINGS)


def test_extract_program_and_compare():
    text = "```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```"
    assert extract_program(text, False) == "print(2)\n"
    assert extract_program("print(3)", False) is None
    assert extract_program("print(3)", True) == "print(3)"
    assert same_output(" 1 \n2  \n\n", "1\n2")
    assert not same_output("1\n2\n3", "1\n2")


async def test_tests_fraction_and_expected(namespaces_available):
    reward = CodeReward(_runner(), True, "")
    params = resolve_params(reward.description.params, {}, "p")
    program = _fenced("a, b = map(int, input().split())\nprint(a + b)")
    tests = [
        {"input": "1 2", "output": "3"},
        {"input": "5 5", "output": "10\n"},
        {"input": "1 1", "output": "3"},
    ]
    samples = [
        Sample(id="t", completion=program, metadata={"tests": tests}),
        Sample(id="e", completion=_fenced("print('hi')"), metadata={"expected": "hi"}),
        Sample(id="none", completion="no code", metadata={"expected": "hi"}),
        Sample(id="missing", completion=program),
        Sample(id="bad", completion=program, metadata={"tests": "nope"}),
    ]
    results = await reward.score(samples, params)
    assert results[0].value == pytest.approx(2 / 3) and "test 2: wrong output" in results[0].error
    assert results[1].value == 1.0 and results[1].error == ""
    assert results[2].value == 0.0 and "no ```python" in results[2].error
    assert results[3].value is None and "required" in results[3].error
    assert results[4].value is None and "tests" in results[4].error
    whole = resolve_params(reward.description.params, {"whole_text_fallback": True}, "p")
    assert (
        await reward.score([Sample(id="w", completion="print('hi')", metadata={"expected": "hi"})], whole)
    )[0].value == 1.0


async def test_program_runs_as_pid_2_without_network(namespaces_available):
    result = await _runner().run(
        "import os, socket\nprint(os.getpid())\nprint(sorted(socket.if_nameindex()))\nprint(os.getcwd())"
    )
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[0] == "2"
    assert lines[1] == "[(1, 'lo')]"
    assert lines[2] == "/tmp"


async def test_a_flood_on_both_streams_ends_with_the_run(namespaces_available):
    # Far past the cap on stdout and stderr at once, in 1 MiB writes: the run ends at the overflow, both
    # captures capped, and the supervisor reaps the killed program without waiting on its full pipes.
    program = "import os\nblock = b'x' * (1 << 20)\nwhile True:\n"
    program += "    os.write(1, block)\n    os.write(2, block)\n"
    start = time.monotonic()
    result = await asyncio.wait_for(_runner().run(program), timeout=30)
    assert "output exceeded" in result.failure
    assert len(result.stdout) <= SETTINGS.max_output_bytes
    assert time.monotonic() - start < SETTINGS.wall_timeout_s + 5


def _code_params(reward: CodeReward) -> dict:
    return resolve_params(reward.description.params, {}, "p")


async def test_more_tests_than_the_cap_is_a_sample_error_naming_the_limit(namespaces_available):
    reward = CodeReward(SandboxRunner(SETTINGS.model_copy(update={"max_tests_per_sample": 3})), True, "")
    tests = [{"input": "", "output": "1"}] * 4
    ok, over = await reward.score(
        [
            Sample(id="ok", completion=_fenced("print(1)"), metadata={"tests": tests[:3]}),
            Sample(id="over", completion=_fenced("print(1)"), metadata={"tests": tests}),
        ],
        _code_params(reward),
    )
    assert ok.value == 1.0
    assert over.value is None and "sandbox.max_tests_per_sample" in over.error and "4 tests" in over.error


async def test_a_request_stops_running_once_its_cpu_budget_is_spent(namespaces_available):
    settings = SETTINGS.model_copy(
        update={"cpu_time_s": 1, "max_cpu_s_per_request": 2, "concurrency": 1, "wall_timeout_s": 10}
    )
    reward = CodeReward(SandboxRunner(settings), True, "")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\nprint(1)"
    tests = [{"input": "", "output": "1"}] * 6
    (result,) = await reward.score(
        [Sample(id="b", completion=_fenced(burn), metadata={"tests": tests})], _code_params(reward)
    )
    # Each run reserves 1 s (RLIMIT_CPU granularity) and is charged the ~0.55 s it used: 2 or 3 runs fit.
    assert 1 / 6 <= result.value <= 4 / 6, result
    assert "sandbox.max_cpu_s_per_request=2" in result.error
    # A new request has its own budget.
    (again,) = await reward.score(
        [Sample(id="c", completion=_fenced("print(1)"), metadata={"expected": "1"})], _code_params(reward)
    )
    assert again.value == 1.0


async def test_a_big_request_does_not_delay_a_small_one_beyond_one_run(namespaces_available):
    """Two slots; a request with 12 one-second tests takes 6 s or more; a one-test request that arrives
    just after it gets the next free slot (round-robin), not the slot after all 12."""
    settings = SETTINGS.model_copy(update={"concurrency": 2, "wall_timeout_s": 10})
    reward = CodeReward(SandboxRunner(settings), True, "")
    params = _code_params(reward)
    slow = _fenced("import time\ntime.sleep(1)\nprint(1)")
    big = Sample(id="big", completion=slow, metadata={"tests": [{"input": "", "output": "1"}] * 12})
    small = Sample(id="small", completion=_fenced("print(2)"), metadata={"expected": "2"})
    start = time.monotonic()
    big_task = asyncio.ensure_future(reward.score([big], params))
    await asyncio.sleep(0.3)
    (small_result,) = await reward.score([small], params)
    small_done = time.monotonic() - start
    (big_result,) = await big_task
    big_done = time.monotonic() - start
    assert small_result.value == 1.0 and big_result.value == 1.0
    assert big_done >= 6
    assert small_done < big_done / 2, (small_done, big_done)


async def test_fair_slots_alternate_between_lanes():
    slots = FairSlots(1)
    order: list[str] = []

    async def run(lane, name):
        async with lane.slot():
            order.append(name)
            await asyncio.sleep(0)

    big, small = slots.lane(), slots.lane()
    tasks = [asyncio.ensure_future(run(big, f"b{i}")) for i in range(5)]
    await asyncio.sleep(0)
    tasks += [asyncio.ensure_future(run(small, f"s{i}")) for i in range(2)]
    await asyncio.gather(*tasks)
    # b1 was granted and b2 queued before the small lane arrived; from then on the lanes alternate
    # (first come, first served would run s0 after b4).
    assert order == ["b0", "b1", "b2", "s0", "b3", "s1", "b4"]


async def test_a_cancelled_waiter_does_not_lose_its_slot():
    slots = FairSlots(1)
    lane = slots.lane()
    holder = asyncio.Event()

    async def hold():
        async with lane.slot():
            await holder.wait()

    first = asyncio.ensure_future(hold())
    await asyncio.sleep(0)
    waiter = asyncio.ensure_future(lane.slot().__aenter__())
    await asyncio.sleep(0)
    waiter.cancel()
    holder.set()
    await first
    async with asyncio.timeout(1), slots.lane().slot():
        pass


def test_excerpt_is_bounded_valid_utf8_of_the_last_line():
    assert excerpt(b"Traceback...\n  File x\nValueError: bad\n\n", 100) == "ValueError: bad"
    messy = b"E: \x1b[31mred\x07 \xff\xfe " + "é".encode() * 400
    text = excerpt(messy, 64)
    assert len(text.encode()) <= 64 and "\x1b" not in text and "\x07" not in text
    text.encode("utf-8")  # valid
    assert excerpt(b"", 10) == ""


async def test_what_a_program_prints_reaches_the_caller_only_as_an_excerpt(namespaces_available):
    secret = "not-for-the-caller-3c1f"
    program = (
        "import sys\n"
        f"sys.stderr.write('{secret}\\n' * 1000)\n"
        "sys.stderr.write('x' * 5000 + '\\n')\n"
        "raise SystemExit(3)"
    )
    result = await _runner().run(program)
    assert result.failure.startswith("exit code 3: xxx")
    assert len(result.failure.encode()) <= SETTINGS.error_excerpt_bytes + len("exit code 3: ")
    assert secret not in result.failure


@pytest.fixture
def bwrap_refusing_proc():
    """bwrap as inside a Docker container without systempaths=unconfined: mounting a fresh /proc fails
    (with bwrap's own message); everything else is the real bwrap. In a dir the sandbox's uid can reach."""
    where = Path(tempfile.mkdtemp(prefix="grpo-bwrap-"))
    where.chmod(0o755)
    wrapper = where / "bwrap"
    wrapper.write_text(
        '#!/bin/sh\nfor a in "$@"; do\n  if [ "$a" = --proc ]; then\n'
        '    echo "bwrap: Can\'t mount proc on /newroot/proc: Operation not permitted" >&2; exit 1\n'
        '  fi\ndone\nexec /usr/bin/bwrap "$@"\n'
    )
    wrapper.chmod(0o755)
    yield str(wrapper)
    shutil.rmtree(where)


async def test_auto_runs_without_proc_where_a_fresh_proc_is_refused(bwrap_refusing_proc):
    settings = SETTINGS.model_copy(update={"bwrap_path": bwrap_refusing_proc})
    runner, status = await open_runner(settings)
    assert runner is not None and not runner.mount_proc, status
    assert "no /proc" in status
    result = await runner.run("import os\nprint(sorted(os.listdir('/')))")
    assert result.stdout.strip() == "['bin', 'dev', 'lib', 'lib64', 'tmp', 'usr']", result
    refused, reason = await open_runner(settings.model_copy(update={"mount_proc": "true"}))
    assert refused is None and "Can't mount proc" in reason


async def test_auto_mounts_a_fresh_proc_where_allowed(namespaces_available):
    runner, status = await open_runner(SETTINGS)
    assert runner is not None and runner.mount_proc and "a /proc of its own" in status
    result = await runner.run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert result.stdout.strip() == "[1, 2]"  # the launcher and the program: nothing of the host


async def test_a_cancelled_request_kills_its_runs_and_frees_the_slot(namespaces_available):
    marker = f"grpo-cancel-{time.monotonic_ns()}"
    runner = SandboxRunner(SETTINGS.model_copy(update={"concurrency": 1, "wall_timeout_s": 30}))
    program = (
        "import os, time\nif os.fork() == 0:\n    os.execv('/usr/bin/python3', "
        f"['python3', '-c', 'import time; time.sleep(60)', '{marker}'])\ntime.sleep(60)"
    )
    task = asyncio.ensure_future(runner.run(program))
    await asyncio.sleep(1.0)
    assert _with_marker(marker), "the program did not start"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _with_marker(marker) == []
    result = await asyncio.wait_for(runner.run("print(1)"), timeout=10)
    assert result.stdout == "1\n"


def _with_marker(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


async def test_a_request_keeps_at_most_concurrency_runs_in_flight(namespaces_available):
    """Many tests queue as data, not as one task each (a request with thousands of tests holds no
    thousands of coroutines)."""
    settings = SETTINGS.model_copy(update={"concurrency": 2})
    reward = CodeReward(SandboxRunner(settings), True, "")
    samples = [
        Sample(id=str(i), completion=_fenced("print(1)"), metadata={"tests": [{"output": "1"}] * 10})
        for i in range(4)
    ]
    before = len(asyncio.all_tasks())
    scoring = asyncio.ensure_future(reward.score(samples, _code_params(reward)))
    most = 0
    while not scoring.done():
        most = max(most, len(asyncio.all_tasks()) - before)
        await asyncio.sleep(0.02)
    assert [r.value for r in scoring.result()] == [1.0] * 4
    # The request, and per slot a worker and its run's four stream tasks; one task per test would be 40+.
    assert most <= 1 + settings.concurrency * 6, most


async def test_a_fork_bomb_does_not_use_up_a_concurrent_runs_processes(namespaces_available):
    """RLIMIT_NPROC is counted per run (its own user namespace), not per host uid shared by all runs."""
    runner = SandboxRunner(SETTINGS.model_copy(update={"concurrency": 2, "max_processes": 8}))
    hog = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(3)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
        "print(n)\ntime.sleep(1.5)"
    )
    neighbour = (
        "import os, time\ntime.sleep(0.5)\nkids = []\nfor i in range(5):\n    pid = os.fork()\n"
        "    if pid == 0:\n        os._exit(0)\n    kids.append(pid)\nfor pid in kids:\n"
        "    os.waitpid(pid, 0)\nprint(len(kids))"
    )
    held, other = await asyncio.gather(runner.run(hog), runner.run(neighbour))
    assert held.stdout.strip() == "6", held  # 8 tasks: PID 1, the program and 6 children
    assert other.ok and other.stdout.strip() == "5", other
