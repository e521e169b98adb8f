"""docs/config.md cannot drift from the run-config models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GEN_CONFIG_DOCS = Path(__file__).resolve().parents[3] / "scripts" / "gen_config_docs.py"


def test_checked_in_config_reference_matches_the_models():
    result = subprocess.run(
        [sys.executable, str(GEN_CONFIG_DOCS), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"run `python scripts/gen_config_docs.py`:\n{result.stderr[-3000:]}"
