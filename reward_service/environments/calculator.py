"""``calculator``: arithmetic on an expression the model writes, by walking its syntax tree (never ``eval``).

Accepted: int and float literals, ``+ - * / // % **``, unary ``+ -``, parentheses, the functions
``abs``, ``round``, ``sqrt``, ``floor``, ``ceil``, ``min``, ``max`` and the constants ``pi``, ``e``. Integers
stay exact (Python ints). Every input is bounded before work is done, not only every output: expression
length, node count, the decimal digits of every integer (each result, and the result of a product or power
estimated from bit lengths *before* it is computed), ``|exponent|`` of ``**`` and ``|ndigits|`` of
``round`` (an integer rounded to ``-n`` digits costs a power of ten with ``n`` digits, whatever the small
result). Bounded ints make every other operation cheap (``//`` and ``%`` of bounded ints, float conversions),
so no expression can take more than milliseconds or allocate more than a few KiB.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from grpo_runtime.env_types import ToolDefinition
from reward_service.environments.base import ToolError
from reward_service.environments.settings import CalculatorSettings

# log10(2): decimal digits per bit.
DIGITS_PER_BIT = 0.30103

TOOL = ToolDefinition(
    name="calculator",
    description="Evaluates an arithmetic expression and returns its value. Supports + - * / // % ** and "
    "parentheses, abs, round, sqrt, floor, ceil, min, max, pi and e. Integers are exact.",
    parameters={
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "The expression, e.g. '(123 + 456) * 789'."}
        },
        "required": ["expression"],
    },
)

BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
    "min": min,
    "max": max,
}
CONSTANTS = {"pi": math.pi, "e": math.e}


def format_number(value: int | float) -> str:
    """An int as its digits; a float as Python's shortest repr, integral floats below 1e15 without '.0'."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class Calculator:
    """Evaluates expressions within ``settings``' bounds."""

    def __init__(self, settings: CalculatorSettings):
        self._settings = settings

    def evaluate(self, expression: str) -> int | float:
        """The value of ``expression``; ToolError saying what is not allowed or went wrong."""
        s = self._settings
        if len(expression) > s.max_expression_chars:
            raise ToolError(f"expression is {len(expression)} characters, at most {s.max_expression_chars}")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except (SyntaxError, ValueError) as exc:
            raise ToolError(f"not an arithmetic expression: {getattr(exc, 'msg', exc)}") from None
        except RecursionError:
            raise ToolError("expression is nested too deeply") from None
        nodes = sum(1 for _ in ast.walk(tree))
        if nodes > s.max_nodes:
            raise ToolError(f"expression has {nodes} parts, at most {s.max_nodes}")
        try:
            return self._eval(tree.body)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
        except (ValueError, TypeError) as exc:
            raise ToolError(str(exc)) from None

    def _check(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise ToolError("the result is not a real number")
        if isinstance(value, int):
            self._refuse_digits(value.bit_length())
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError("result is not finite")
        return value

    def _refuse_digits(self, bits: int) -> None:
        """ToolError when an integer of ``bits`` bits would have more than max_result_digits digits."""
        if bits * DIGITS_PER_BIT > self._settings.max_result_digits:
            raise ToolError(f"result has more than {self._settings.max_result_digits} digits")

    def _power(self, base: int | float, exponent: int | float) -> int | float:
        if abs(exponent) > self._settings.max_exponent:
            raise ToolError(
                f"exponent {format_number(exponent)} is larger than {self._settings.max_exponent}"
            )
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
            self._refuse_digits((base.bit_length() - 1) * exponent)
        return base**exponent

    def _binary(self, op: ast.operator, left: int | float, right: int | float) -> int | float:
        if isinstance(op, ast.Pow):
            return self._power(left, right)
        if isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            # A product has at least bit_length(a) + bit_length(b) - 1 bits.
            self._refuse_digits(left.bit_length() + right.bit_length() - 1)
        return BINARY[type(op)](left, right)

    def _call(self, name: str, args: list[int | float]) -> int | float:
        if name == "round" and len(args) == 2 and isinstance(args[1], int):
            ndigits, bound = args[1], self._settings.max_result_digits
            if abs(ndigits) > bound:
                raise ToolError(f"round's ndigits {ndigits} is beyond ±{bound} (the most digits of a result)")
        return FUNCTIONS[name](*args)

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._check(node.value)
        if isinstance(node, ast.Name) and node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            return self._check(UNARY[type(node.op)](self._eval(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            return self._check(self._binary(node.op, left, right))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FUNCTIONS
            and not node.keywords
        ):
            args = [self._eval(a) for a in node.args]
            return self._check(self._call(node.func.id, args))
        raise ToolError(f"not allowed in an expression: {ast.unparse(node)[:80]!r}")


class CalculatorSession:
    """A calculator holds no state; each episode still gets its own session (the registry's unit)."""

    tools: tuple[ToolDefinition, ...] = (TOOL,)
    prompt_suffix = ""

    def __init__(self, calculator: Calculator):
        self._calculator = calculator

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        return format_number(self._calculator.evaluate(arguments["expression"]))

    async def reward(self) -> float | None:
        return None

    async def close(self) -> None:
        return None


class CalculatorEnvironment:
    kind = "calculator"
    available = True
    status = ""

    def __init__(self, settings: CalculatorSettings, name: str = "calculator"):
        self.name = name
        self.description = "A `calculator(expression)` tool: exact integer and float arithmetic."
        self._calculator = Calculator(settings)

    async def open(self, metadata: dict[str, Any]) -> CalculatorSession:
        return CalculatorSession(self._calculator)
