"""The Node.js example servers (examples/node: env_server.js, agent_server.js) started as users start
them: a real ``node`` process on a free loopback port. Needs ``node`` (20+) and ``npm`` on PATH; ``npm ci``
runs once when a dependency is missing from examples/node/node_modules."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: the Node.js environment tests need Node.js 20+ and npm")
    return path


@dataclass(frozen=True)
class NodeServer:
    address: str
    process: subprocess.Popen


def node_env_server(*args: str) -> AbstractContextManager[NodeServer]:
    """Runs ``node env_server.js --port 0 *args``; yields it, terminates it on exit (if still running)."""
    return node_server("env_server.js", *args)


@contextmanager
def node_server(script: str, *args: str) -> Iterator[NodeServer]:
    """Runs ``node SCRIPT --port 0 *args`` in examples/node (``npm ci`` first when a dependency is missing);
    yields it once it prints its address, terminates it on exit (if still running)."""
    installed = all((NODE_DIR / "node_modules" / name).is_dir() for name in ("@grpc/grpc-js", "openai"))
    # npm ci also compiles the TypeScript agent (its prepare script) to dist/.
    if not installed or not (NODE_DIR / script).is_file():
        subprocess.run([_tool("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=600)
    process = subprocess.Popen(
        [_tool("node"), script, "--port", "0", *args],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = process.stdout.readline()  # the server prints one line once it listens (or why it cannot)
        match = LISTENING.search(line)
        assert match, f"the Node server did not start: {line}"
        yield NodeServer(f"127.0.0.1:{match.group(1)}", process)
    finally:
        process.terminate()
        process.wait(timeout=30)
