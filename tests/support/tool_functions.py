"""Plain functions served as tools (TRL's ``GRPOTrainer(tools=[...])``) by the functions environment."""

from __future__ import annotations


def multiply(a: int, b: int) -> int:
    """Multiplies two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def shout(text: str) -> str:
    """Upper-cases a text.

    Args:
        text: What to upper-case.
    """
    return text.upper()


def divide(a: int, b: int) -> float:
    """Divides a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def untyped(a):
    """No type hints."""
    return a


def reset(target: int) -> str:
    """Named like a TRL class's episode hook.

    Args:
        target: Anything.
    """
    return str(target)


NOT_A_FUNCTION = 3
