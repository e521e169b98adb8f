"""Fixtures of the deployment tests: the checkov linter, kept in its own virtual environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_VENV = REPO_ROOT / ".venv-tools"
TOOLS_REQUIREMENTS = Path(__file__).parent / "requirements-tools.txt"


def _ensure_tools_venv() -> Path:
    """``.venv-tools/bin/checkov``; creates the tools venv (pinned checkov) when `make setup` has not."""
    checkov = TOOLS_VENV / "bin" / "checkov"
    if checkov.exists():
        return checkov
    # Same interpreter version as the project; its own site-packages, so checkov's pins cannot touch .venv.
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(TOOLS_VENV)], check=True, timeout=300)
    pip = [str(TOOLS_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-r", str(TOOLS_REQUIREMENTS)], check=True, timeout=900)
    return checkov


@pytest.fixture(scope="session")
def checkov_bin() -> Path:
    """Path of the checkov executable (env CHECKOV overrides the tools venv)."""
    override = os.environ.get("CHECKOV")
    return Path(override) if override else _ensure_tools_venv()
