"""OpenMP wait policy for the services' processes, set before torch loads its OpenMP runtime.

torch's CPU kernels run on an OpenMP pool whose idle threads spin-wait (libgomp's default) after each
parallel region. The trio's processes take turns on the same cores (the trainer waits while the rollout
service generates, the rollout service idles while the trainer steps), so each one's spinning pool steals
the cores the other is working on. A process with cores of its own loses a little to passive waiting (a
sleeping thread takes longer to wake), so an ``OMP_WAIT_POLICY`` the operator set wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# libgomp reads these once, when the library loads (``import torch``); later changes have no effect.
SHARED_CORE_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE"}


def prefer_passive_openmp(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless it is set; returns what was set ({} = nothing).

    Call it before anything imports torch: the services' ``__main__`` modules do so first thing.
    """
    added = {key: value for key, value in SHARED_CORE_OPENMP.items() if key not in environ}
    environ.update(added)
    return added
