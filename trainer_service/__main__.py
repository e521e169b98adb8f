"""``python -m trainer_service [--port P] | train CONFIG.yaml | demo [--config FILE]`` (see cli.py)."""

from __future__ import annotations

import sys

from trainer_service.cli import main

if __name__ == "__main__":
    sys.exit(main())
