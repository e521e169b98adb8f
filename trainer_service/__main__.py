"""``python -m trainer_service [--port P] | train CONFIG.yaml | check CONFIG.yaml | demo [--config FILE]``.

Serving is :mod:`trainer_service.server`; the ``train`` and ``demo`` commands are :mod:`trainer_service.cli`,
``check`` is :mod:`trainer_service.check`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from grpo_runtime.openmp import shared_core_openmp

# Before the imports below load torch (and with it OpenMP, which reads its spin settings once).
shared_core_openmp()

from trainer_service.check import check  # noqa: E402
from trainer_service.cli import demo, train  # noqa: E402
from trainer_service.server import serve  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "train":
        return train(args[1:])
    if args and args[0] == "check":
        return check(args[1:])
    if args and args[0] == "demo":
        return demo(args[1:])
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
