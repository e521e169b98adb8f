import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["reward_service", "rollout_service", "trainer_service"])
def test_service_entry_points_start_openmp_with_the_shorter_spin(module, monkeypatch):
    # libgomp prints the settings it read when torch loaded it; one set any later would be ignored.
    monkeypatch.setenv("OMP_DISPLAY_ENV", "verbose")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    # Importing vLLM adds torch's libgomp to this process's LD_PRELOAD; a preloaded libgomp starts before
    # Python does, so no entry point could change what it reads (see grpo_runtime.openmp).
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    # The entry point runs as `python -m` runs it; torch is imported after it, as the first reward model
    # imports it in the reward service (rollout and trainer have loaded it already by then).
    program = (
        "import runpy, sys\n"
        f"sys.argv = [{module!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
        "except SystemExit:\n"
        "    pass\n"
        "import torch\n"
    )
    command = [sys.executable, "-c", program]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    spin_counts = {
        line.split("=")[1].strip().strip("'")
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip().startswith("GOMP_SPINCOUNT")
    }
    assert spin_counts == {"100000"}  # libgomp's own default is 300000
