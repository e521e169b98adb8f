"""The optional gVisor backend (sandbox.backend: runsc): the same containment as bwrap's, checked on a few
hostile programs. Skipped where Debian's `runsc` is not installed."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time

import psutil
import pytest

from reward_service.sandbox.runner import open_runner
from reward_service.sandbox.settings import SandboxSettings

pytestmark = pytest.mark.skipif(shutil.which("runsc") is None, reason="gVisor's runsc is not installed")

SECRET = f"grpo-runsc-secret-{os.getpid()}"
MARKER = f"grpo-runsc-{os.getpid()}-{time.monotonic_ns()}"
SETTINGS = SandboxSettings(backend="runsc", wall_timeout_s=4, cpu_time_s=2, memory_mb=512, concurrency=2)


async def test_runsc_contains_hostile_programs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_ADMIN_TOKEN", SECRET)
    tmp_path.chmod(0o755)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    runner, status = await open_runner(SETTINGS)
    assert runner is not None, status
    assert "gVisor" in status
    programs = {
        "answer": "print(int(input()) * 2)",
        "secret_file": f"print(open({str(secret_file)!r}).read())",
        "environment": "import os\nprint(dict(os.environ))",
        "write_host": f"open({str(open_dir / MARKER)!r}, 'w').write('x')",
        "write_tmp": f"open('/tmp/{MARKER}', 'w').write('x')\nprint('private')",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), 1)",
        "sleep_forever": f"import os, time\nif os.fork() == 0:\n    os.execv('/usr/bin/python3', "
        f"['python3', '-c', 'import time; time.sleep(60)', '{MARKER}'])\ntime.sleep(60)",
    }
    outcomes = await asyncio.gather(*(runner.run(p, "21") for p in programs.values()))
    results = dict(zip(programs, outcomes, strict=True))
    assert results["answer"].stdout == "42\n"
    for name, result in results.items():
        assert SECRET not in result.stdout and SECRET not in result.failure, name
    assert "No such file" in results["secret_file"].failure
    assert "GRPO_ADMIN_TOKEN" not in results["environment"].stdout
    assert results["write_host"].failure and not (open_dir / MARKER).exists()
    assert results["write_tmp"].stdout == "private\n" and not (tmp_path.parent / MARKER).exists()
    assert not os.path.exists(f"/tmp/{MARKER}")
    assert results["network"].failure
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    assert "timed out" in results["sleep_forever"].failure
    stray = [p for p in psutil.process_iter(["cmdline"]) if MARKER in " ".join(p.info["cmdline"] or [])]
    assert stray == []
