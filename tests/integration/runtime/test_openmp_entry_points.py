import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["reward_service", "rollout_service", "trainer_service"])
def test_service_entry_points_start_openmp_with_passive_waiting(module, monkeypatch):
    # libgomp prints the policy it read when torch loaded it; one set any later would be ignored.
    monkeypatch.setenv("OMP_DISPLAY_ENV", "true")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    policies = {
        line.split("=")[1].strip().strip("'")
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip().startswith("OMP_WAIT_POLICY")
    }
    assert policies == {"PASSIVE"}
