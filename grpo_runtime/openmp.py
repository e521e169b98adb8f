"""OpenMP spin-wait for the services' processes, set before torch loads its OpenMP runtime.

torch's CPU kernels run on an OpenMP pool whose idle threads spin before they sleep: libgomp's default is
300,000 spins after each parallel region. The trio's processes take turns on the same cores (the trainer
waits while the rollout service generates, the rollout service idles while the trainer steps), so each
idle pool spins on the cores the working process needs. A shorter spin keeps a pool hot across the short
gaps inside a forward pass but lets it sleep soon after its process starts waiting on another. Measured on
2 shared cores (``bench/e2e_bench.py``, sync trio ÷ TRL in one process, 8 steps × 4 rounds): libgomp's
default 1.43×, ``OMP_WAIT_POLICY=PASSIVE`` (no spin) 1.32×, ``GOMP_SPINCOUNT=100000`` 1.06×. A wait policy
or spin count the operator set wins (``OMP_WAIT_POLICY=ACTIVE`` for a process with cores to itself).

A libgomp in ``LD_PRELOAD`` starts before Python, so it keeps libgomp's default: set the variable in the
environment of such a process. vLLM's CPU workers preload torch's libgomp, but they inherit the service's
environment, which already holds the setting when they start.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# libgomp reads these once, when the library loads (``import torch``); later changes have no effect.
SHARED_CORE_OPENMP = {"GOMP_SPINCOUNT": "100000"}
# Either one, set by the operator, decides how long threads spin; ours would override their policy.
OPERATOR_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def shared_core_openmp(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Add :data:`SHARED_CORE_OPENMP` to ``environ`` unless it sets a wait policy or spin count; returns what
    was added ({} = nothing).

    Call it before anything imports torch: the services' ``__main__`` modules do so first thing.
    """
    if any(key in environ for key in OPERATOR_KEYS):
        return {}
    environ.update(SHARED_CORE_OPENMP)
    return dict(SHARED_CORE_OPENMP)
