"""Every function in ``trainer_service/training/`` fits on one screen: at most 60 lines, decorators included.

A job's assembly reads as a sequence of named steps (:mod:`trainer_service.training.assembly`); a function
past this bound is the place where a step wants its own name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TRAINING = ROOT / "trainer_service" / "training"
MAX_LINES = 60


def function_spans(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines spanned) of every function and method in ``path``."""
    spans = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                assert child.end_lineno is not None
                spans.append((f"{prefix}{child.name}", first, child.end_lineno - first + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return spans


SOURCES = sorted(TRAINING.rglob("*.py"))


def test_the_training_package_has_sources():
    assert len(SOURCES) > 5


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.name)
def test_no_function_is_longer_than_sixty_lines(path):
    long = [
        f"{name} (line {first}): {lines} lines"
        for name, first, lines in function_spans(path)
        if lines > MAX_LINES
    ]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_LINES} lines: {long}"


def test_the_measure_counts_decorators_and_nested_functions(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "import functools\n"
        "class A:\n"
        "    @functools.cache\n"
        "    def method(self):\n"
        "        def inner():\n"
        "            return 1\n"
        "        return inner\n"
        "async def coroutine():\n"
        "    pass\n"
    )
    assert function_spans(source) == [("A.method", 3, 5), ("A.method.inner", 5, 2), ("coroutine", 8, 2)]
