"""The `calculator` environment: exact arithmetic by an AST walker, and every bound it enforces."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_service.environments.base import ToolError
from reward_service.environments.calculator import DIGITS_PER_BIT, FUNCTIONS, Calculator, format_number
from reward_service.environments.settings import CalculatorSettings
from tests.support.child_calls import ChildCalls

CALC = Calculator(CalculatorSettings())
# Far beyond the microseconds an expression takes: only a blow-up (work that grows with a value) reaches it.
GENEROUS_S = 20.0


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("123 + 456", "579"),
        ("(123 + 456) * 789", "456831"),
        ("987 * 654", "645498"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("2 ** -1", "0.5"),
        ("sqrt(16) + abs(-2)", "6"),
        ("round(2.675, 2)", "2.67"),
        ("max(1, 5, 3) - min(4, 2)", "3"),
        ("floor(2.5) + ceil(2.5)", "5"),
        ("pi > 3", None),  # comparisons are not arithmetic
        (" 1 + 1 ", "2"),
    ],
)
def test_values(expression, value):
    if value is None:
        with pytest.raises(ToolError, match="not allowed"):
            CALC.evaluate(expression)
    else:
        assert format_number(CALC.evaluate(expression)) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('id')", "not allowed"),
        ("().__class__.__bases__", "not allowed"),
        ("open('/etc/passwd')", "not allowed"),
        ("x + 1", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("True + 1", "not allowed"),
        ("lambda: 1", "not allowed"),
        ("[1, 2]", "not allowed"),
        ("round(1, ndigits=2)", "not allowed"),
        ("1 +", "not an arithmetic expression"),
        ("1 / 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-1)", "math domain error"),
        ("(-8) ** 0.5", "not a real number"),
        ("2 ** 10001", "exponent"),
        ("9 ** 999 * 9 ** 999", "digits"),
        ("10 ** 999 * 10 ** 999", "digits"),
        ("1e308 * 10", "not finite"),
        ("2.0 ** 1000 * 2.0 ** 1000", "not finite"),
        ("1.5 ** 999", None),  # within every bound
        ("1" + "+1" * 150, "parts"),
        ("1" * 2000, "characters"),
        ("(" * 300 + "1" + ")" * 300, "not an arithmetic expression"),
    ],
)
def test_refusals(expression, reason):
    if reason is None:
        assert CALC.evaluate(expression) > 0
        return
    with pytest.raises(ToolError, match=reason):
        CALC.evaluate(expression)


def test_power_is_refused_before_it_is_computed():
    # 99**999 would have 1994 digits: refused from bit lengths, so nothing big is ever built.
    small = Calculator(CalculatorSettings(max_result_digits=50, max_exponent=10**6))
    with pytest.raises(ToolError, match="more than 50 digits"):
        small.evaluate("99 ** 999999")
    assert small.evaluate("99 ** 25") == 99**25


@pytest.fixture(scope="module")
def child() -> Iterator[ChildCalls]:
    calls = ChildCalls()
    yield calls
    calls.close()


def evaluated(child: ChildCalls, expression: str) -> tuple[str, object]:
    """``CALC.evaluate(expression)`` in the child, within GENEROUS_S (else the test fails naming it)."""
    return child.call(CALC.evaluate, expression, timeout_s=GENEROUS_S)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        # int.__round__ computes 10 ** -ndigits before it returns 0: hours for these, unbounded.
        ("round(1, -10 ** 999)", "ndigits"),
        ("round(7, -999999999999)", "ndigits"),
        ("round(-(10 ** 999), -(10 ** 999))", "ndigits"),
        ("round(1.5, 10 ** 999)", "ndigits"),
        # A product is refused from its operands' bit lengths before it is computed.
        ("(10 ** 999) * (10 ** 999)", "digits"),
        ("9 ** 999 * 9 ** 999 * 9 ** 999", "digits"),
        ("10 ** (10 ** 999)", "exponent"),
        ("(10 ** 999) ** (10 ** 999)", "exponent"),
        ("floor(1e308) ** 4", "digits"),
    ],
)
def test_huge_magnitudes_are_refused_before_the_work(child, expression, reason):
    outcome, value = evaluated(child, expression)
    assert outcome == "raised" and isinstance(value, ToolError), value
    assert reason in str(value)


def test_round_within_its_bound_still_rounds():
    assert CALC.evaluate("round(123456, -3)") == 123000
    assert CALC.evaluate("round(10 ** 999 + 1, -999)") == 10**999
    assert CALC.evaluate("round(1, -1000)") == 0


# Huge magnitudes of both signs, exact and float: every operand and argument is one of these half the time.
MAGNITUDES = st.sampled_from(
    [
        "10 ** 999",
        "(-(10 ** 999))",
        "999999999999",
        "(-999999999999)",
        "9" * 300,
        "1e308",
        "(-1e308)",
        "5e-324",
    ]
)
LEAVES = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.integers(-(10**40), 10**40).map(lambda n: f"({n})"),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: f"({x!r})"),
    st.sampled_from(["pi", "e", "0", "(-1)"]),
    MAGNITUDES,
)
OPERATORS = ["+", "-", "*", "/", "//", "%", "**"]


def _call(
    name: str, arity: st.SearchStrategy[int], operand: st.SearchStrategy[str]
) -> st.SearchStrategy[str]:
    args = arity.flatmap(lambda n: st.lists(operand, min_size=n, max_size=n))
    return args.map(lambda a: f"{name}({', '.join(a)})")


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Every operator and every function with each arity it takes, on operands of any magnitude."""
    operand = st.one_of(inner, MAGNITUDES)
    binary = st.builds(lambda a, op, b: f"({a} {op} {b})", operand, st.sampled_from(OPERATORS), operand)
    unary = st.builds(lambda op, a: f"{op}({a})", st.sampled_from(["-", "+"]), operand)
    arities = {"round": st.integers(1, 2), "min": st.integers(1, 3), "max": st.integers(1, 3)}
    calls = [_call(name, arities.get(name, st.just(1)), operand) for name in sorted(FUNCTIONS)]
    return st.one_of(binary, unary, *calls)


EXPRESSIONS = st.recursive(LEAVES, _extend, max_leaves=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression=EXPRESSIONS)
def test_random_expressions_end_fast_in_a_bounded_number_or_a_tool_error(child, expression):
    """Whatever the magnitudes, an expression ends within GENEROUS_S (microseconds in practice) with a finite
    number within the digit bound or a ToolError, never another exception."""
    outcome, value = evaluated(child, expression)
    if outcome == "raised":
        assert isinstance(value, ToolError), f"{expression}: {value!r}"
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool), expression
    if isinstance(value, float):
        assert math.isfinite(value), expression
    else:
        assert value.bit_length() * DIGITS_PER_BIT <= CalculatorSettings().max_result_digits, expression
