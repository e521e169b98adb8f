"""Several tests of one program in one sandbox run, ``on_timeout``, and fairness with looping programs.

The launcher (``reward_service/sandbox/launcher.py``) goes through a sample's tests in one sandbox while
they leave nothing behind; these tests check that each test still sees only its own input and a sandbox as
fresh as its own would be, that a hanging program costs one time limit with ``fail_rest``/``zero``, and
that a small request is scored before a big batch of looping programs finishes.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from grpo_runtime.errors import InvalidArgument
from reward_service.core.types import Sample
from reward_service.rewards.code import CodeReward
from reward_service.rewards.params import resolve_params
from reward_service.sandbox.backends import RunBatch
from reward_service.sandbox.limits import RunLimits
from reward_service.sandbox.reports import BadReport, parse_header
from reward_service.sandbox.runner import SandboxRunner, open_runner
from reward_service.sandbox.settings import SandboxSettings
from tests.support.sandboxes import running_sandboxes

# Tests share a sandbox run for up to 30 s here, so that a loaded machine does not split a run by time.
SETTINGS = SandboxSettings(wall_timeout_s=1.0, cpu_time_s=1, memory_mb=256, concurrency=2, batch_wall_s=30)
PID = "import os\nprint(os.getpid())\n"
LOOP = "while True:\n    pass"
# Each writes its leftover when its input is "w", and prints what it sees of one.
LEFTOVERS = {
    "file": "import os\nif input() == 'w':\n    open('/tmp/left', 'w').write('x')\nprint(os.listdir('/tmp'))",
    "tmp_timestamps": "import os\nif input() == 'w':\n    os.utime('/tmp', (1, 1))\n"
    "print(os.stat('/tmp').st_mtime == 1)",
    "sysv_shm": "import ctypes\nlibc = ctypes.CDLL(None)\nif input() == 'w':\n"
    "    libc.shmget(0, 4096, 0o1600)\nbuf = ctypes.create_string_buffer(256)\nlibc.shmctl(0, 14, buf)\n"
    "print(int.from_bytes(buf.raw[:4], 'little'))",
    # x86_64 system call numbers: add_key 248, keyctl 250.
    "user_key": "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.syscall.restype = ctypes.c_long\n"
    "if input() == 'w':\n    libc.syscall(248, b'user', b'left', b'x', 1, -4)\n"
    "print(libc.syscall(250, 11, -4, None, 0))",  # KEYCTL_READ of @u: bytes of key ids it holds
}


def _fenced(program: str) -> str:
    return f"```python\n{program}\n```\n"


@pytest.fixture(scope="module")
def runner() -> SandboxRunner:
    found, status = asyncio.run(open_runner(SETTINGS))
    assert found is not None, f"these tests need bubblewrap and user namespaces: {status}"
    return SandboxRunner(SETTINGS, found.backend)


def _params(reward: CodeReward, **given) -> dict:
    return resolve_params(reward.description.params, given, "p")


async def test_tests_share_a_sandbox_and_each_reads_only_its_own_input(runner):
    program = f"import sys\n{PID}print(repr(sys.stdin.read()))"
    results = await runner.run_tests(program, ["a\nb", "", "c" * 5000])
    assert all(r.ok for r in results), results
    pids = [int(r.stdout.split()[0]) for r in results]
    assert pids[0] == 2 and pids == sorted(pids) and pids[-1] > 2  # one sandbox, one program after another
    assert [r.stdout.split("\n")[1] for r in results] == [repr("a\nb"), repr(""), repr("c" * 5000)]


async def test_an_input_larger_than_the_file_size_limit_reaches_the_program_whole(runner):
    small_files = SandboxRunner(SETTINGS.model_copy(update={"max_file_mb": 1}), runner.backend)
    big = "7" * (3 << 20)
    results = await small_files.run_tests("import sys\nprint(len(sys.stdin.read()))", [big, "", big])
    assert [r.stdout for r in results] == [f"{len(big)}\n", "0\n", f"{len(big)}\n"], results


async def test_batch_wall_zero_gives_every_test_a_fresh_sandbox():
    runner = SandboxRunner(SETTINGS.model_copy(update={"batch_wall_s": 0}))
    results = await runner.run_tests(PID, ["", "", ""])
    assert [r.stdout for r in results] == ["2\n"] * 3


@pytest.mark.parametrize("kind", list(LEFTOVERS))
async def test_a_test_that_leaves_something_sends_the_next_to_a_fresh_sandbox(runner, kind):
    """Every test sees what a sandbox of its own would show, whatever the test before it left."""
    if kind == "user_key" and os.uname().machine != "x86_64":
        pytest.skip("the program uses x86_64 system call numbers")
    program = PID + LEFTOVERS[kind]
    alone = await runner.run(program, "r")
    results = await runner.run_tests(program, ["r", "w", "r", "r"])
    assert all(r.ok for r in results), results
    seen = [r.stdout.split("\n", 1) for r in results]
    assert seen[2] == alone.stdout.split("\n", 1), (kind, seen)  # fresh: PID 2 and nothing left
    assert seen[3][1] == seen[2][1] and int(seen[3][0]) > 2  # a clean test does not end the sandbox run


async def test_no_process_of_a_test_lives_into_the_next(runner):
    if not runner.mount_proc:
        pytest.skip("no /proc in this sandbox to list processes with")
    program = PID + "import time\nif input() == 'fork':\n    if os.fork() == 0:\n        time.sleep(30)\n"
    program += "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    first, second = await runner.run_tests(program, ["fork", "look"])
    pid = second.stdout.split()[0]
    assert second.stdout.split("\n")[1] == f"[1, {pid}]", (first, second)


async def test_the_output_cap_holds_per_test_and_the_next_test_still_runs(runner):
    cap = SETTINGS.max_output_bytes
    program = "import sys\nprint('x' * int(input()))\nsys.stderr.write('e' * 5000)"
    results = await runner.run_tests(program, [str(cap - 1), str(cap), "3"])
    assert [len(r.stdout) for r in results] == [cap, cap, 4]
    assert [r.limit for r in results] == ["", "output", ""]
    assert results[1].failure == f"output exceeded {cap} bytes"


async def test_posix_message_queues_are_refused(runner):
    program = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    program += "print(libc.mq_open(b'/q', os.O_CREAT | os.O_RDWR, 0o600, None), ctypes.get_errno())"
    result = await runner.run(program)
    assert result.stdout.split() == ["-1", "24"]  # EMFILE: RLIMIT_MSGQUEUE 0


async def test_stop_at_timeout_ends_a_programs_tests_at_its_first_timeout(runner):
    program = "import time\nif input() == 'hang':\n    time.sleep(60)\nprint(1)"
    stdins = ["ok", "hang", "ok", "hang"]
    everything = await runner.run_tests(program, stdins)
    assert [r.limit for r in everything] == ["", "wall", "", "wall"]
    assert everything[1].failure == "timed out after 1s" and everything[1].timed_out
    stopped = await runner.run_tests(program, stdins, stop_at_timeout=True)
    assert [r.limit for r in stopped] == ["", "wall"]
    burner = await runner.run_tests(LOOP, ["", ""], stop_at_timeout=True)
    assert len(burner) == 1 and burner[0].timed_out, burner


async def test_on_timeout_continue_fail_rest_and_zero(runner):
    reward = CodeReward(runner, True, "")
    program = _fenced("import time\nn = int(input())\nif n == 1:\n    time.sleep(60)\nprint(n)")
    tests = [{"input": str(n), "output": str(n)} for n in (0, 1, 2, 3)]
    sample = [Sample(id="s", completion=program, metadata={"tests": tests})]
    (kept,) = await reward.score(sample, _params(reward))
    assert kept.value == 3 / 4 and kept.error == "test 1: timed out after 1s"
    (rest,) = await reward.score(sample, _params(reward, on_timeout="fail_rest"))
    assert rest.value == 1 / 4
    assert rest.error == (
        "test 1: timed out after 1s, 2 later tests not run and counted as failed (on_timeout=fail_rest)"
    )
    (zero,) = await reward.score(sample, _params(reward, on_timeout="zero"))
    assert zero.value == 0.0
    assert zero.error == "test 1: timed out after 1s; value 0, 2 later tests not run (on_timeout=zero)"
    passing = [Sample(id="p", completion=_fenced("print(input())"), metadata={"tests": tests})]
    for mode in ("continue", "fail_rest", "zero"):
        (result,) = await reward.score(passing, _params(reward, on_timeout=mode))
        assert result.value == 1.0 and result.error == "", (mode, result)


async def test_a_looping_sample_costs_one_run_with_fail_rest(runner):
    reward = CodeReward(runner, True, "")
    tests = [{"input": "", "output": "1"}] * 6
    samples = [Sample(id=str(i), completion=_fenced(LOOP), metadata={"tests": tests}) for i in range(2)]
    results = await reward.score(samples, _params(reward, on_timeout="fail_rest"))
    for result in results:
        assert result.value == 0.0
        assert result.error.startswith("test 0: ") and "5 later tests not run" in result.error, result


def test_on_timeout_must_be_one_of_its_choices():
    reward = CodeReward(None, False, "")
    with pytest.raises(InvalidArgument) as refused:
        _params(reward, on_timeout="skip")
    assert refused.value.field == "p.on_timeout"


async def test_a_small_request_is_scored_before_a_big_looping_batch_finishes(runner):
    """One slot; a request of 4 samples × 4 tests of a program that loops needs it for 16 time limits
    (on_timeout=continue; a timed-out test outlasts batch_wall_s, so each is a sandbox run of its own).
    A one-test request that arrives while the big one runs gets the slot at the next turn, not after
    the whole batch."""
    one_slot = SandboxRunner(
        SETTINGS.model_copy(update={"concurrency": 1, "batch_wall_s": 1}), runner.backend
    )
    reward = CodeReward(one_slot, True, "")
    loop_tests = [{"input": "", "output": "1"}] * 4
    big = [Sample(id=f"b{i}", completion=_fenced(LOOP), metadata={"tests": loop_tests}) for i in range(4)]
    small = [Sample(id="small", completion=_fenced("print(2)"), metadata={"expected": "2"})]
    big_task = asyncio.ensure_future(reward.score(big, _params(reward)))
    async with asyncio.timeout(30):
        while running_sandboxes() == 0:  # the big request holds the slot
            await asyncio.sleep(0.05)
    small_task = asyncio.ensure_future(reward.score(small, _params(reward)))
    done, _ = await asyncio.wait({big_task, small_task}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {small_task}
    assert small_task.result()[0].value == 1.0
    big_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big_task
    async with asyncio.timeout(30):
        while running_sandboxes():  # the cancelled request's run is killed
            await asyncio.sleep(0.05)


def _batch(**changes) -> RunBatch:
    batch = RunBatch(
        limits=RunLimits.from_settings(SETTINGS, 2),
        inputs=((0, 1),),
        cpu_time_s=2,
        cpu_grant_s=3,
        wall_timeout_s=2,
        batch_wall_s=1,
        stop_at_timeout=False,
        max_output_bytes=100,
        tail_bytes=10,
    )
    return RunBatch(**{**batch.__dict__, **changes})


def test_a_report_is_checked_against_the_runs_caps():
    good = {"status": 0, "limit": "", "cpu_s": 0.1, "cpu_limit_s": 2, "wall_s": 0.2, "out": 100, "err": 10}
    assert parse_header(json.dumps(good).encode(), _batch())["out"] == 100
    bad = [
        {**good, "out": 101},
        {**good, "err": 11},
        {**good, "limit": "other"},
        {**good, "cpu_s": -1},
        {**good, "wall_s": float("nan")},
        {**good, "cpu_limit_s": 3},
        {**good, "status": 1 << 16},
        {**good, "status": True},
        {key: value for key, value in good.items() if key != "out"},
    ]
    for header in bad:
        with pytest.raises(BadReport):
            parse_header(json.dumps(header).encode(), _batch())
    for line in (b"[]", b"not json", b'"x"'):
        with pytest.raises(BadReport):
            parse_header(line, _batch())
