"""Settings errors name the key; without namespaces `code` is refused unless weak isolation is allowed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from grpo_runtime.config import ConfigError
from reward_service.sandbox.runner import SandboxRunner
from reward_service.sandbox.settings import SandboxSettings
from reward_service.server import open_sandbox
from reward_service.settings import load_settings


def test_settings_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"sandbox\.memory_mb"):
        load_settings({"sandbox": {"memory_mb": "lots"}})
    with pytest.raises(ConfigError, match=r"mathverify\.nope"):
        load_settings({"mathverify": {"nope": 1}})
    with pytest.raises(ConfigError, match="surprise"):
        load_settings({"surprise": True})
    assert load_settings({"max_samples": 10}).max_samples == 10


async def test_without_namespaces_code_is_refused_by_default():
    settings = load_settings({"sandbox": {"unshare_path": "/nonexistent/unshare"}})
    runner, available, status = await open_sandbox(settings)
    assert runner is None and not available
    assert "refused" in status and "allow_weak_isolation" in status


async def test_weak_isolation_when_allowed_still_limits_the_program(monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "weak-mode-secret")
    settings = load_settings(
        {
            "sandbox": {
                "unshare_path": "/nonexistent/unshare",
                "allow_weak_isolation": True,
                "wall_timeout_s": 2,
            }
        }
    )
    runner, available, status = await open_sandbox(settings)
    assert available and runner is not None and not runner.namespaces
    assert status.startswith("WEAK isolation")
    result = await runner.run("import os\nprint(sorted(os.environ))\nprint(open('main.py').read()[:5])")
    assert result.ok, result
    assert "GRPO_TEST_SECRET" not in result.stdout
    slow = await runner.run("while True:\n    pass")
    assert "timed out" in slow.failure
    memory = await runner.run("x = bytearray(2**34)")
    assert "MemoryError" in memory.failure


async def test_runs_unprivileged_outside_its_namespace():
    """Root inside the sandbox's namespace is nobody (65534) outside when the service runs as root."""
    expected = 65534 if os.geteuid() == 0 else os.geteuid()
    marker = f"uid-probe-{os.getpid()}-{time.monotonic_ns()}"
    runner = SandboxRunner(SandboxSettings(wall_timeout_s=5), namespaces=True)
    run = asyncio.ensure_future(
        runner.run(f"import os, time\n# {marker}\nprint(os.getuid())\ntime.sleep(1.5)")
    )
    uids = set()
    for _ in range(50):
        await asyncio.sleep(0.05)
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    status = Path(f"/proc/{entry}/status").read_text()
                    uids.add(int(next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1]))
            except (OSError, StopIteration):
                pass
        if uids:
            break
    result = await run
    assert result.ok and result.stdout.strip() == "0"  # root inside the namespace
    assert uids == {expected}
