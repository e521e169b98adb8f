"""``python -m rollout_service``."""

import sys

from grpo_runtime.openmp import prefer_passive_openmp

# Before the imports below load torch (and with it OpenMP, which reads its wait policy once).
prefer_passive_openmp()

from rollout_service.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
