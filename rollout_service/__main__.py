"""``python -m rollout_service``."""

import sys

from rollout_service.server import main

if __name__ == "__main__":
    sys.exit(main())
