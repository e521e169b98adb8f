"""``python -m rollout_service``."""

import sys

from grpo_runtime.openmp import shared_core_openmp

# Before the imports below load torch (and with it OpenMP, which reads its spin settings once).
shared_core_openmp()

from rollout_service.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
