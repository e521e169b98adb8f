"""Which ``checkpoint-N`` directories a run can resume from.

The HF Trainer writes a checkpoint in place: weights, optimizer, scheduler and RNG state first, then
``trainer_state.json`` last. A process killed part-way leaves a directory without (or with a truncated)
``trainer_state.json``; resuming from it fails in ``Trainer.train``. A checkpoint counts as complete when its
state file reads as JSON with a ``global_step``, which the Trainer writes only after every other file.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def is_complete(checkpoint: Path) -> bool:
    """True when ``checkpoint/trainer_state.json`` parses and holds the step it was saved at."""
    try:
        state = json.loads((checkpoint / TRAINER_STATE_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and isinstance(state.get("global_step"), int)


def last_complete_checkpoint(output_dir: Path) -> Path | None:
    """The complete ``checkpoint-N`` in ``output_dir`` with the largest N; None when there is none.

    Incomplete ones newer than it are skipped with a warning (a run killed while saving) and left on disk:
    the resumed run writes that step's checkpoint into the same directory again.
    """
    numbered = []
    for path in output_dir.iterdir():
        if match := _CHECKPOINT_NAME.match(path.name):
            numbered.append((int(match.group(1)), path))
    for _, path in sorted(numbered, reverse=True):
        if not path.is_dir():
            continue
        if is_complete(path):
            return path
        logger.warning("skipping %s: no readable %s (saving was interrupted)", path, TRAINER_STATE_NAME)
    return None
