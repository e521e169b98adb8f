"""The checked-in generated code matches the protos; buf lint and the breaking check pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BUF = REPO / ".venv" / "bin" / "buf"


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_generated_code_has_no_drift():
    result = _run(sys.executable, "-m", "grpo_runtime.codegen", "--check")
    assert result.returncode == 0, result.stderr
    assert "generated code matches protos/" in result.stdout


def test_buf_lint_passes():
    result = _run(str(BUF), "lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_script_passes_against_the_previous_commit():
    result = _run(str(REPO / "scripts" / "buf_breaking.sh"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "buf breaking:" in result.stdout
