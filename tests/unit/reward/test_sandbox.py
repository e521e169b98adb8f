"""The code sandbox: test scoring, and hostile programs that must each score 0 with a reason."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from reward_service.rewards.code import CodeReward, extract_program, same_output
from reward_service.rewards.params import resolve_params
from reward_service.sandbox.runner import SandboxRunner, probe_namespaces
from reward_service.sandbox.settings import SandboxSettings
from reward_service.types import Sample

SECRET = "grpo-test-secret-7f3a9c"
SETTINGS = SandboxSettings(wall_timeout_s=2.0, cpu_time_s=2, memory_mb=256, concurrency=4)


def _fenced(program: str) -> str:
    return f"Here is my solution:\n```python\n{program}\n```\n"


def hostile_programs(marker: str, host_file: Path, port: int) -> dict[str, str]:
    """Name → program. Each is expected to print 42, but none may get there."""
    return {
        "infinite_loop": "while True:\n    pass",
        "sleep": "import time\ntime.sleep(60)\nprint(42)",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory_bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 2**20))",
        "output_flood": "while True:\n    print('x' * 4096)",
        "network_connect": f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'leak')\nprint(42)",
        "network_external": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint(42)",
        "env_secret": "import os\nprint(os.environ.get('GRPO_TEST_SECRET') or open('/proc/1/environ').read() "
        "or 'none')",
        "proc_environ_scan": "import os\nfor p in os.listdir('/proc'):\n    try:\n"
        "        print(open(f'/proc/{p}/environ').read())\n    except Exception:\n        pass",
        "write_outside": f"open({str(host_file)!r}, 'w').write('pwned')\nprint(42)",
        "write_host_tmp": f"open('/tmp/{marker}-tmp', 'w').write('pwned')\n"
        f"print(open('/tmp/{marker}-tmp').read())\n"
        "raise SystemExit(3)",
        "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
        "os.kill(1, signal.SIGKILL)\n"
        "print(42)\nraise SystemExit(1)",
        "kill_all": "import os, signal\nos.kill(-1, signal.SIGKILL)\nraise SystemExit(1)",
        "daemonized_child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        import sys\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', "
        f"'{marker}'])\n    os._exit(0)\nprint('started')",
        "deep_recursion": "import sys\nsys.setrecursionlimit(10**7)\n"
        "def f(n):\n    return f(n + 1) + 1\nprint(f(0))",
        "segfault": "import ctypes\nctypes.string_at(0)",
        "huge_file": "with open('big', 'wb') as f:\n    while True:\n        f.write(b'\\0' * 2**20)",
        "thread_storm": "import threading, time\nts = []\nwhile True:\n"
        "    t = threading.Thread(target=time.sleep, args=(30,))\n    t.start()\n    ts.append(t)",
        "ignore_sigterm": "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n"
        "    time.sleep(0.1)",
        "unmount_tmp": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.umount2(b'/tmp', 2) != 0:\n"
        "    raise SystemExit('umount refused')\nprint(42)",
    }


@pytest.fixture(scope="module")
def namespaces_available() -> bool:
    ok, detail = asyncio.run(probe_namespaces(SETTINGS))
    assert ok, f"these tests need unprivileged user namespaces: {detail}"
    return ok


def _runner() -> SandboxRunner:
    return SandboxRunner(SETTINGS, namespaces=True)


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


def _running_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.slow
async def test_hostile_programs_all_score_zero(namespaces_available, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", SECRET)
    marker = f"grpo-sbx-{os.getpid()}-{time.monotonic_ns()}"
    host_file = tmp_path / "outside.txt"
    tmp_path.chmod(0o777)  # even a world-writable host dir must stay out of reach
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    programs = hostile_programs(marker, host_file, port)
    assert len(programs) >= 15

    reward = CodeReward(_runner(), True, "")
    params = resolve_params(reward.description.params, {}, "p")
    samples = [
        Sample(id=name, completion=_fenced(p), metadata={"expected": "42"}) for name, p in programs.items()
    ]
    start = time.monotonic()
    results = await reward.score(samples, params)
    elapsed = time.monotonic() - start

    for name, result in zip(programs, results, strict=True):
        assert result.value == 0.0, f"{name}: {result}"
        assert result.error, f"{name} has no reason"
        assert SECRET not in result.error
    # Bounded: 20 programs, 4 at a time, 2 s wall limit each (+ start-up).
    assert elapsed < 30, elapsed
    reasons = {name: r.error for name, r in zip(programs, results, strict=True)}
    assert "timed out" in reasons["infinite_loop"] and "timed out" in reasons["ignore_sigterm"]
    assert "output exceeded" in reasons["output_flood"]
    assert "SIGSEGV" in reasons["segfault"]
    assert "umount refused" in reasons["unmount_tmp"]
    assert not host_file.exists()
    assert not Path(f"/tmp/{marker}-tmp").exists()
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    await asyncio.sleep(0.2)
    assert _running_with(marker) == []
    for name, reason in reasons.items():
        print(f"{name}: {reason}")


async def test_env_secret_never_reaches_the_program(namespaces_available, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", SECRET)
    runner = _runner()
    result = await runner.run(
        "import os\nprint(dict(os.environ))\nfor p in os.listdir('/proc'):\n    try:\n"
        "        print(open(f'/proc/{p}/environ').read())\n    except Exception:\n        pass"
    )
    assert result.ok, result
    assert SECRET not in result.stdout and SECRET not in result.stderr


async def test_daemonized_child_is_gone_after_the_run(namespaces_available):
    marker = f"grpo-daemon-{os.getpid()}-{time.monotonic_ns()}"
    program = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        import sys\n"
        "        os.execv(sys.executable, "
        f"[sys.executable, '-c', 'import time; time.sleep(30)', '{marker}'])\n"
        "    os._exit(0)\n"
        "import time\ntime.sleep(0.3)\nprint('parent done')"
    )
    result = await _runner().run(program)
    assert result.ok and "parent done" in result.stdout
    await asyncio.sleep(0.2)
    assert _running_with(marker) == []


async def test_program_runs_as_pid_2_without_network(namespaces_available):
    result = await _runner().run(
        "import os, socket\nprint(os.getpid())\nprint(sorted(socket.if_nameindex()))\nprint(os.getcwd())"
    )
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[0] == "2"
    assert lines[1] == "[(1, 'lo')]"
    assert lines[2] == "/tmp/work"


async def test_a_flood_on_both_streams_ends_with_the_run(namespaces_available):
    # Far past the cap on stdout and stderr at once, in 1 MiB writes: the run ends at the overflow, both
    # captures capped, and the supervisor reaps the killed program without waiting on its full pipes.
    program = "import os\nblock = b'x' * (1 << 20)\nwhile True:\n"
    program += "    os.write(1, block)\n    os.write(2, block)\n"
    start = time.monotonic()
    result = await asyncio.wait_for(_runner().run(program), timeout=30)
    assert "output exceeded" in result.failure
    assert len(result.stdout) <= SETTINGS.max_output_bytes and len(result.stderr) <= SETTINGS.max_output_bytes
    assert time.monotonic() - start < SETTINGS.wall_timeout_s + 5
