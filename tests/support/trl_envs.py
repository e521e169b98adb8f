"""TRL environment classes (``environment_factory`` style) for the environment tests, by import path."""

from __future__ import annotations

import asyncio
import os
import time


class Counter:
    """Counts up to a target; the reward is 1 when the count hits it exactly."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0

    def reset(self, target: int = 3, **columns) -> str:
        self.count, self.target = 0, int(target)
        return f"\nReach exactly {self.target}."

    def increment(self, by: int) -> str:
        """Adds to the counter.

        Args:
            by: How much to add.

        Returns:
            The new count.
        """
        self.count += by
        return f"count={self.count}"

    async def peek(self) -> int:
        """Returns the count without changing it."""
        return self.count

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0

    def _private(self) -> None:
        raise AssertionError("not a tool")


class Misbehaving:
    """Tools that hang, flood, raise or return odd things; reset returns nothing."""

    def reset(self, **columns) -> None:
        return None

    def hang(self, seconds: float) -> str:
        """Sleeps in its thread.

        Args:
            seconds: How long to sleep.
        """
        time.sleep(seconds)
        return "woke up"

    async def hang_async(self, seconds: float) -> str:
        """Sleeps on the event loop without blocking it.

        Args:
            seconds: How long to sleep.
        """
        await asyncio.sleep(seconds)
        return "woke up"

    def flood(self, chars: int) -> str:
        """Returns a long text.

        Args:
            chars: Its length.
        """
        return "x" * chars

    def fail(self, message: str) -> str:
        """Raises.

        Args:
            message: The exception's message.
        """
        raise ValueError(message)

    def surrogate(self) -> str:
        """Returns text with a lone surrogate, which UTF-8 cannot encode."""
        return "bad \ud800 text"

    def secret(self) -> str:
        """Reads the test secret from the service's environment."""
        return os.environ.get("GRPO_TEST_SECRET", "")

    def get_reward(self) -> float:
        return float("nan")


class NoReset:
    def tool(self) -> str:
        """A tool."""
        return ""


class Untyped:
    def reset(self, **columns) -> None:
        return None

    def tool(self, x):
        """A tool without type hints, which get_json_schema refuses."""
        return x


class Echo:
    """Echoes text; no reward of its own."""

    def reset(self, **columns) -> None:
        return None

    def echo(self, text: str) -> str:
        """Returns its argument.

        Args:
            text: What to return.
        """
        return text
