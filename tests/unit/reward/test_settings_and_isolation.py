"""Settings errors name the key; without bubblewrap or the interpreter `code` is refused."""

from __future__ import annotations

import asyncio
import contextlib
import os

import psutil
import pytest

from grpo_runtime.config import ConfigError
from reward_service.sandbox.runner import SandboxRunner
from reward_service.sandbox.settings import SandboxSettings
from reward_service.server import open_sandbox
from reward_service.settings import load_settings


def test_settings_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"sandbox\.memory_mb"):
        load_settings({"sandbox": {"memory_mb": "lots"}})
    with pytest.raises(ConfigError, match=r"checkers\.nope"):
        load_settings({"checkers": {"nope": 1}})
    with pytest.raises(ConfigError, match="surprise"):
        load_settings({"surprise": True})
    assert load_settings({"max_samples": 10}).max_samples == 10


async def test_without_bubblewrap_code_is_refused():
    settings = load_settings({"sandbox": {"bwrap_path": "/nonexistent/bwrap"}})
    runner, available, status = await open_sandbox(settings)
    assert runner is None and not available
    assert "refused" in status and "bwrap" in status


async def test_without_the_interpreter_code_is_refused():
    settings = load_settings({"sandbox": {"python": "/nonexistent/python3"}})
    runner, available, status = await open_sandbox(settings)
    assert runner is None and not available
    assert "sandbox.python" in status


async def test_runs_unprivileged_outside_its_namespace():
    """The sandbox's processes are nobody (65534) on the host when the service runs as root; the program
    is uid 65534 inside its namespace as well."""
    expected = 65534 if os.geteuid() == 0 else os.geteuid()
    runner = SandboxRunner(SandboxSettings(wall_timeout_s=5))
    before = {p.pid for p in psutil.process_iter()}
    run = asyncio.ensure_future(runner.run("import os, time\nprint(os.getuid())\ntime.sleep(1.5)"))
    uids = set()
    for _ in range(50):
        await asyncio.sleep(0.05)
        for proc in psutil.process_iter(["cmdline", "uids"]):
            if proc.pid not in before and "main.py" in (proc.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):  # only this test's runs, not other sandboxes
                    if os.getpid() in [p.pid for p in proc.parents()]:
                        uids.add(proc.info["uids"].real)
        if uids:
            break
    result = await run
    assert result.ok and result.stdout.strip() == "65534"
    assert uids == {expected}
