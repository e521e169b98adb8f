"""A fast path for the number literals of LaTeX answers, giving exactly what it replaces.

latex2sympy (math-verify's LaTeX parser) turns each number literal of a gold or an answer into a SymPy number
with ``sympy.Number(text)``. For a string that goes through ``sympify`` and ``parse_expr``, which rebuilds its
namespace with ``exec("from sympy import *")`` on every call: about 0.8 ms a literal, some 15 % of checking
a typical answer. For the literals that are plain ASCII decimals, ``parse_expr``'s ``auto_number``
transformation fixes the result, which can be built directly:

* ``0`` or ``[1-9][0-9]*``: ``auto_number`` rewrites the token to ``Integer(<token>)``, so the result is
  ``sympy.Integer(int(text))``;
* ``[0-9]+.[0-9]+``: ``auto_number`` rewrites the token to ``Float('<token>')``, so the result is
  ``sympy.Float(text)``.

latex2sympy's own ``parse_number`` first drops commas and an integer's leading zeros; on these texts that
changes nothing, so both paths call ``sympy.Number`` on the same text. Every other text (commas, leading
zeros, exponents, Unicode digits, more than ``MAX_DIGITS`` characters) goes to latex2sympy's
``parse_number`` unchanged.

``install`` puts the fast path in front of ``parse_number`` only for the latex2sympy release whose
``parse_number`` was read for this (``VERIFIED_VERSION``, the one math-verify 0.9 pins); under any other
release answers are checked without it (slower, same values). Property tests compare the fast path with the
original on generated literals, LaTeX expressions and verdicts (tests/unit/reward/test_number_literals.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

import sympy
from latex2sympy2_extended import latex2sympy2

VERIFIED_VERSION = "1.11.0"
# Longest literal taken by the fast path: far below Python's limit on converting digit strings to int
# (4300 digits), past which the two paths would fail differently.
MAX_DIGITS = 1000
_INTEGER = re.compile(r"0|[1-9][0-9]*")
_DECIMAL = re.compile(r"[0-9]+\.[0-9]+")

_original_parse_number: Callable[[Any, str], Any] | None = None


def plain_number(text: str) -> sympy.Number | None:
    """``sympy.Number(text)`` built directly for a plain ASCII integer or decimal; None for any other text."""
    if len(text) > MAX_DIGITS:
        return None
    if _INTEGER.fullmatch(text):
        return sympy.Integer(int(text))
    if _DECIMAL.fullmatch(text):
        return sympy.Float(text)
    return None


def _parse_number(converter: Any, text: str) -> Any:
    number = plain_number(text)
    if number is not None:
        return number
    assert _original_parse_number is not None
    return _original_parse_number(converter, text)


def install() -> bool:
    """Puts ``plain_number`` in front of latex2sympy's ``parse_number`` in this process (once); False, and
    nothing changed, under a latex2sympy release other than ``VERIFIED_VERSION``."""
    global _original_parse_number
    if metadata.version("latex2sympy2_extended") != VERIFIED_VERSION:
        return False
    if _original_parse_number is None:
        _original_parse_number = latex2sympy2._Latex2Sympy.parse_number
        latex2sympy2._Latex2Sympy.parse_number = _parse_number  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    """Restores latex2sympy's own ``parse_number`` (for tests that compare both)."""
    global _original_parse_number
    if _original_parse_number is not None:
        latex2sympy2._Latex2Sympy.parse_number = _original_parse_number  # type: ignore[method-assign]
        _original_parse_number = None
