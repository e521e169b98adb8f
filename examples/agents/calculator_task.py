"""What the example agents share: the calculator they give the model, the question and reward of a data row,
and their command line. Nothing here knows an agent framework.

A data row reaches an agent as JSON (``RunEpisodeRequest.task``): ``prompt`` (chat messages or a string) and,
for the arithmetic tasks, ``answer``, the expected number as text.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import logging
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo_runtime.agent_server import RunEpisode, run_agent

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e15  # larger intermediate results are refused (no huge products kept in memory)
CALCULATOR_DESCRIPTION = "Evaluates an arithmetic expression of numbers, + - * / and parentheses."
CALCULATOR_PARAMETERS = {
    "type": "object",
    "properties": {"expression": {"type": "string", "description": "For example 347 + 582."}},
    "required": ["expression"],
    "additionalProperties": False,
}
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def evaluate(expression: str) -> float:
    """The value of ``expression`` (numbers, + - * /, unary minus, parentheses); ValueError for anything
    else, a division by zero, or a value beyond ``MAX_MAGNITUDE``. Never calls ``eval``."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is over {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {error.msg}") from None
    return _value(tree.body)


def _value(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = float(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        value = OPERATORS[type(node.op)](left, right)
    else:
        raise ValueError(f"unsupported element {type(node).__name__}: use numbers, + - * / and parentheses")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"a value beyond {MAX_MAGNITUDE:g}")
    return value


def calculator(expression: str) -> str:
    """The tool's answer to the model: the value (an integer when whole), or ``error: why``."""
    try:
        value = evaluate(expression)
    except ValueError as error:
        return f"error: {error}"
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def question_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The row's prompt as chat messages (a string prompt becomes one user message)."""
    prompt = task["prompt"]
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def reward(answer: str, task: dict[str, Any]) -> float | None:
    """1.0 when the last number in ``answer`` equals the row's ``answer``, else 0.0; None when the row has
    no answer (the trainer's reward functions judge alone)."""
    gold = task.get("answer")
    if gold in (None, ""):
        return None
    numbers = NUMBER.findall(answer)
    try:
        return float(bool(numbers) and float(numbers[-1]) == float(str(gold)))
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class Sampling:
    """How an agent calls the policy: ``max_tokens`` per call, ``max_turns`` model calls per episode. The
    trainer's sessions pin the run's own sampling (temperature included) whatever an agent sends."""

    model: str = "policy"
    temperature: float = 1.0
    max_tokens: int = 128
    max_turns: int = 4


def parse_args(description: str) -> tuple[str, int, Sampling]:
    """``--host``, ``--port`` and the :class:`Sampling` fields from the command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50060, help="AgentService port (training.agents.target)")
    parser.add_argument("--model", default=Sampling.model, help="model name sent to the gateway")
    parser.add_argument("--temperature", type=float, default=Sampling.temperature)
    parser.add_argument("--max-tokens", type=int, default=Sampling.max_tokens, help="per model call")
    parser.add_argument("--max-turns", type=int, default=Sampling.max_turns, help="model calls per episode")
    args = parser.parse_args()
    sampling = Sampling(args.model, args.temperature, args.max_tokens, args.max_turns)
    return args.host, args.port, sampling


def serve(episode_player: Callable[[Sampling], RunEpisode], description: str) -> None:
    """An example agent's command: ``episode_player``'s episodes served on ``--host``/``--port`` until
    interrupted, with the :class:`Sampling` of the command line."""
    host, port, sampling = parse_args(description)
    logging.basicConfig(level=logging.INFO)
    asyncio.run(run_agent(episode_player(sampling), port=port, host=host))
