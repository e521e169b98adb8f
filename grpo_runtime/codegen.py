"""Generate Python protobuf messages, gRPC stubs and ``.pyi`` stubs from ``protos/``.

``python -m grpo_runtime.codegen --proto-root protos --out gen/python`` regenerates the
checked-in code; ``--check`` regenerates into a temporary directory and exits 1 when it
differs from what is checked in, so CI catches drift.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc


def generate(proto_root: Path, out: Path) -> list[Path]:
    """Compile every ``.proto`` under ``proto_root`` into ``out``; returns the proto files."""
    protos = sorted(proto_root.rglob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_root}")
    out.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Regular packages (not namespace packages) so setuptools and type checkers find them.
    for directory in {p.parent for p in out.rglob("*_pb2.py")}:
        while directory != out:
            (directory / "__init__.py").touch()
            directory = directory.parent
    return protos


def _tree(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def check(proto_root: Path, out: Path) -> list[str]:
    """Return the generated files that differ from those in ``out`` (empty = no drift)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(proto_root, fresh)
        expected, actual = _tree(fresh), _tree(out) if out.exists() else set()
        drift = sorted(str(p) for p in expected ^ actual)
        drift += sorted(
            str(p) for p in expected & actual if not filecmp.cmp(fresh / p, out / p, shallow=False)
        )
    return drift


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-root", type=Path, default=Path("protos"))
    parser.add_argument("--out", type=Path, default=Path("gen/python"))
    parser.add_argument("--check", action="store_true", help="fail when checked-in code differs")
    args = parser.parse_args(argv)
    if args.check:
        drift = check(args.proto_root, args.out)
        if drift:
            print("generated code is out of date; run `make protos`:", *drift, sep="\n  ", file=sys.stderr)
            return 1
        print("generated code matches protos/")
        return 0
    if args.out.exists():
        shutil.rmtree(args.out / "grpo", ignore_errors=True)
    generate(args.proto_root, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
