"""Write a generated file, or check that the checked-in copy matches what the generator makes now.

Shared by the ``scripts/gen_*.py`` generators, whose ``--check`` mode `make lint` and the tests run. They
import it as ``generated_file``: a script run as ``python scripts/<name>.py`` has its directory first on
``sys.path``.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path


def write_or_check(path: Path, text: str, *, check: bool, command: str, source: str) -> int:
    """Write ``text`` to ``path``, or with ``check`` compare them; returns the exit code.

    ``check``: 0 when ``path`` holds exactly ``text``; otherwise 1, with a unified diff (file → generated)
    and the ``command`` that regenerates it on stderr. A missing file counts as empty. ``source`` names
    what the file is generated from, for the message when it matches ("docs/api.md matches the protos").
    """
    if check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "generated"
            )
            sys.stderr.writelines(diff)
            print(f"\n{path} is out of date; run: {command}", file=sys.stderr)
            return 1
        print(f"{path} matches {source}")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0
