"""``python -m trainer_service [--port P] | train CONFIG.yaml | check CONFIG.yaml | demo [--config FILE]``.

Serving is :mod:`trainer_service.server`; the ``train`` and ``demo`` commands are :mod:`trainer_service.cli`,
``check`` is :mod:`trainer_service.check`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trainer_service.check import check
from trainer_service.cli import demo, train
from trainer_service.server import serve


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
