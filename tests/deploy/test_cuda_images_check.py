"""scripts/check_cuda_images.py writes its results file whole and fails when an image is missing, and
docker/cuda_lock.sh's resolution covers every CUDA image's extras (the lock itself runs in `make lint`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECK = REPO_ROOT / "scripts" / "check_cuda_images.py"
LOCK = REPO_ROOT / "docker" / "cuda_lock.sh"


def test_missing_images_fail_the_check_and_are_named(tmp_path):
    out = tmp_path / "cuda_images.json"
    run = subprocess.run(
        [sys.executable, str(CHECK), "--repository", "grpo-services-never-built", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    results = json.loads(out.read_text())
    assert results["ok"] is False and set(results["images"]) == {"reward", "rollout", "trainer"}
    for service, entry in results["images"].items():
        assert entry == {
            "ok": False,
            "error": f"grpo-services-never-built/{service}:cuda is not built (make images-cuda)",
        }
    assert "load_average_1m_at_start" in results and "load_average_1m_at_end" in results


def test_the_lock_resolves_every_cuda_images_extras():
    script = LOCK.read_text()
    requirements = (REPO_ROOT / "docker" / "requirements.py").read_text()
    for extra in ("reward", "rollout", "vllm-cuda", "trainer", "quantization"):
        assert f"--extra {extra}" in script
        assert f'"{extra}"' in requirements
    assert "--python-platform x86_64-manylinux_2_28" in script and "--python-version 3.11" in script
