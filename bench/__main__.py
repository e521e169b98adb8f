"""Run every benchmark: ``python -m bench`` (``make bench``).

Each script measures its baseline in the same run (TRL or the engine in-process) and writes
bench/results/<name>.json; the README summarises those files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent
SCRIPTS = [
    "reward_bench.py",
    "prm_bench.py",
    "judge_bench.py",
    "rollout_bench.py",
    "e2e_bench.py",
    "tools_bench.py",
    "tools_e2e_bench.py",
    "code_bench.py",
    "agent_bench.py",
]


def main() -> int:
    for script in SCRIPTS:
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(BENCH / script)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
