"""The number-literal fast path (``checkers.number_literals``) against latex2sympy's own ``parse_number``:
on literals, on LaTeX expressions built from them, and on math-verify's verdicts (hypothesis)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
from latex2sympy2_extended import latex2sympy
from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy
from math_verify import parse, verify
from math_verify.parser import parse_latex_cached

from reward_service.checkers import number_literals
from reward_service.checkers.options import TRL
from reward_service.checkers.worker import extraction_config

ORIGINAL_PARSE_NUMBER = _Latex2Sympy.parse_number

# Literals the fast path takes, and texts it must leave alone (commas, leading zeros, signs, exponents).
PLAIN_INTEGERS = st.from_regex(r"0|[1-9][0-9]{0,30}", fullmatch=True)
PLAIN_DECIMALS = st.from_regex(r"[0-9]{1,12}\.[0-9]{1,12}", fullmatch=True)
# SymPy itself takes 0.3 s to build a Float of a 5-digit exponent, 32 s of a 6-digit one (10**999999 as an
# integer), longer past that; both paths give such texts to latex2sympy unchanged, so they are left out.
HUGE_EXPONENT = re.compile(r"[eE][-+]?[0-9]{5}")
OTHER_LITERALS = st.one_of(
    st.from_regex(r"[0-9]{1,3}(,[0-9]{3}){1,3}(\.[0-9]{1,3})?", fullmatch=True),
    st.from_regex(r"0[0-9]{1,5}", fullmatch=True),
    st.text(alphabet="0123456789.,eE-+", min_size=1, max_size=10).filter(
        lambda text: not HUGE_EXPONENT.search(text)
    ),
)
LITERALS = st.one_of(PLAIN_INTEGERS, PLAIN_DECIMALS, OTHER_LITERALS)


def outcome(function: Callable[[], Any]) -> tuple[str, str]:
    """What a call gives, comparable across calls: ('value', srepr) or ('error', type and message)."""
    try:
        return "value", sympy.srepr(function())
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def fast_path() -> Iterator[None]:
    assert number_literals.install()
    try:
        yield
    finally:
        number_literals.uninstall()


def with_and_without_fast_path(function: Callable[[], Any]) -> tuple[tuple[str, str], tuple[str, str]]:
    """``outcome(function)`` with the fast path installed, then without it."""
    with fast_path():
        fast = outcome(function)
    return fast, outcome(function)


def test_install_replaces_parse_number_for_the_pinned_latex2sympy_and_uninstall_restores_it():
    with fast_path():
        assert _Latex2Sympy.parse_number is not ORIGINAL_PARSE_NUMBER
        assert number_literals.install()  # a second install keeps the first
    assert _Latex2Sympy.parse_number is ORIGINAL_PARSE_NUMBER


@settings(max_examples=300, deadline=None)
@given(st.one_of(PLAIN_INTEGERS, PLAIN_DECIMALS))
def test_plain_literals_give_what_parse_number_gives(text):
    fast = number_literals.plain_number(text)
    assert fast is not None
    expected = ORIGINAL_PARSE_NUMBER(_Latex2Sympy(), text)
    assert type(fast) is type(expected)
    assert sympy.srepr(fast) == sympy.srepr(expected)


@settings(max_examples=300, deadline=None)
@given(LITERALS)
def test_parse_number_gives_the_same_with_the_fast_path(text):
    fast, original = with_and_without_fast_path(lambda: _Latex2Sympy().parse_number(text))
    assert fast == original


def expressions() -> st.SearchStrategy[str]:
    """LaTeX built from any literal: sums, products, fractions, roots, small powers, percentages, sets."""
    leaves = st.one_of(LITERALS, st.sampled_from(["x", r"\pi"]))

    def compound(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", r"\cdot", "/"]), inner).map(" ".join),
            st.tuples(inner, inner).map(lambda t: rf"\frac{{{t[0]}}}{{{t[1]}}}"),
            inner.map(lambda e: f"({e})"),
            inner.map(lambda e: rf"\sqrt{{{e}}}"),
            st.tuples(inner, st.integers(0, 4)).map(lambda t: f"{{{t[0]}}}^{{{t[1]}}}"),
            inner.map(lambda e: rf"{e}\%"),
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: r"\{" + ", ".join(xs) + r"\}"),
        )

    return st.recursive(leaves, compound, max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(expressions())
def test_latex_expressions_convert_alike_with_and_without_the_fast_path(latex):
    # The call math-verify makes (parser.parse_latex_cached).
    fast, original = with_and_without_fast_path(
        lambda: latex2sympy(latex, is_real=True, convert_degrees=False, normalization_config=None)
    )
    assert fast == original


@settings(max_examples=100, deadline=None)
@given(gold=LITERALS, answer=LITERALS)
def test_math_verify_verdicts_on_numbers_are_unchanged(gold, answer):
    def verdict() -> tuple[str, str, bool]:
        parse_latex_cached.cache_clear()  # math-verify's own cache would answer from the other run
        gold_parsed = parse(f"${gold}$")
        answer_parsed = parse(rf"\boxed{{{answer}}}", extraction_config=extraction_config(TRL))
        return str(gold_parsed), str(answer_parsed), verify(gold_parsed, answer_parsed)

    with fast_path():
        fast = verdict()
    assert fast == verdict()
