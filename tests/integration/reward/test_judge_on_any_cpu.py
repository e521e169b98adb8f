"""The tiny judge, the one model the suite trains at setup, does its job on any x86-64 CPU: torch's float
results depend on the kernels it picks (``ATEN_CPU_CAPABILITY``: default, AVX2, AVX-512) and on MKL's
instruction set, so the same seeded training gives other weights on another machine (oneDNN's ISA limit
changed nothing here). The builder trains to a criterion and fails rather than write a judge that misses
it (tiny_models/judge.py). Here it builds the judge as a CPU below this machine's would (the rest of the
suite covers the native build) and runs the tests that use the judge against each build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from tiny_models.judge import MIN_MARGIN, pointwise_questions
from tiny_models.make import STAMP

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[3]
CAPABILITIES = ("default", "avx2", "avx512")
NATIVE = torch.backends.cpu.get_cpu_capability().lower()
JUDGE_TESTS = (
    "tests/unit/reward/test_judge_model.py",
    "tests/unit/reward/test_judge_remote.py",
    "tests/integration/reward/test_judge.py",
)
# A CPU of each capability short of this machine's, as both torch and MKL would see it.
CPUS = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
BELOW_NATIVE = [
    c for c in CPUS if NATIVE in CAPABILITIES and CAPABILITIES.index(c) < CAPABILITIES.index(NATIVE)
]


def _run(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("cpu", BELOW_NATIVE)
def test_judge_built_on_a_lesser_cpu_passes_the_judge_tests(cpu, tmp_path, tiny_models):
    for kind, path in tiny_models.items():  # the untrained models as built here: only the judge is under test
        if kind != "judge":
            (tmp_path / kind).symlink_to(path.resolve(), target_is_directory=True)
    built = _run(
        [sys.executable, "-m", "tiny_models", "--out", str(tmp_path), "--kinds", "judge"], CPUS[cpu], 900
    )
    assert built.returncode == 0, built.stderr[-3000:]
    figures = json.loads((tmp_path / "judge" / STAMP).read_text())["criterion"]
    assert figures["min_margin"] >= MIN_MARGIN
    assert figures["questions"] == len(pointwise_questions(AutoTokenizer.from_pretrained(tmp_path / "judge")))

    tests = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *JUDGE_TESTS],
        {"TINY_MODELS_DIR": str(tmp_path)},
        900,
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
