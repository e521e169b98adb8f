"""The `calculator` environment: exact arithmetic by an AST walker, and every bound it enforces."""

from __future__ import annotations

import pytest

from reward_service.environments.base import ToolError
from reward_service.environments.calculator import Calculator, format_number
from reward_service.environments.settings import CalculatorSettings

CALC = Calculator(CalculatorSettings())


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
