"""The GPU check (scripts/gpu_check.sh + scripts/gpu_check.py) on CPU: its shell parses and refuses a machine
without a GPU, the results file is written whole with a verdict per step, and the sleep/wake step passes its
dry run against a real rollout service (HF engine)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHELL = REPO_ROOT / "scripts" / "gpu_check.sh"
SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"


def _load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


def _check(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_shell_parses_and_takes_only_dry_run():
    assert subprocess.run(["bash", "-n", str(SHELL)]).returncode == 0
    bad = subprocess.run([str(SHELL), "--bogus"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_shell_refuses_a_machine_without_a_gpu():
    run = subprocess.run([str(SHELL)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and "FAIL gpu_check: no nvidia-smi" in run.stderr


@pytest.mark.slow
def test_sleep_wake_dry_run_keeps_greedy_outputs_through_both_levels(tmp_path, tiny_models):
    out = tmp_path / "gpu_check.json"
    run = _check(
        "sleep-wake", "--device", "cpu", "--work", str(tmp_path / "work"), "--out", str(out), timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS sleep-wake" in run.stdout and "PASS gpu_check" in run.stdout
    results = json.loads(out.read_text())
    assert results["device"] == "cpu" and results["script"] == "scripts/gpu_check.sh"
    for snapshot in (results["at_start"], results["at_end"]):
        assert snapshot["load_average_1m"] >= 0 and "nvidia_smi" in snapshot
    step = results["steps"]["sleep-wake"]
    assert step["status"] == "PASS" and step["numbers"]["engine"] == "hf"
    assert any(step["numbers"]["reference_lengths"])
    level1, level2 = step["numbers"]["level1"], step["numbers"]["level2"]
    assert level1["outputs_identical"] and level2["outputs_identical"]
    # Level 2 drops the weights: invalid after the wake until the push of the same weights.
    assert level1["weights_valid_after_wake"] and not level2["weights_valid_after_wake"]
    assert level2["weights_valid_after_push"] and level2["policy_version"] == 2
