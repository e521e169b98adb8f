"""The one retry helper: which failures it retries, how long it waits, when it gives up."""

from __future__ import annotations

import grpc
import pytest

from grpo_runtime.call_errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)
from grpo_runtime.retry import RetryPolicy, call_with_retry


class Clock:
    """Time that passes only when the helper sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def failing(errors: list[Exception], result: str = "ok"):
    """A call that raises ``errors`` in turn, then returns ``result``; ``calls`` counts the attempts."""

    def call() -> str:
        call.calls += 1
        if errors:
            raise errors.pop(0)
        return result

    call.calls = 0
    return call


def run(call, policy: RetryPolicy, clock: Clock, **kwargs):
    return call_with_retry(call, policy, sleep=clock.sleep, clock=clock, **kwargs)


def unavailable() -> UnavailableError:
    return UnavailableError(grpc.StatusCode.UNAVAILABLE, "down")


def test_retryable_failures_are_retried_with_exponential_backoff():
    clock = Clock()
    errors = [unavailable(), DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"), unavailable()]
    call = failing(errors)
    policy = RetryPolicy(budget_s=60, initial_backoff_s=0.5, max_backoff_s=1.5)
    assert run(call, policy, clock) == "ok"
    assert call.calls == 4 and clock.sleeps == [0.5, 1.0, 1.5]


@pytest.mark.parametrize(
    "error",
    [
        InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "n: must be >= 1"),
        ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_samples=8"),  # no pushback
        ValueError("not a call error"),
    ],
)
def test_other_failures_raise_at_once(error):
    clock = Clock()
    call = failing([error])
    with pytest.raises(type(error)):
        run(call, RetryPolicy(budget_s=60), clock)
    assert call.calls == 1 and clock.sleeps == []


def test_pushback_is_retried_after_the_wait_it_names_when_longer_than_the_backoff():
    clock = Clock()
    busy = ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", retry_after_s=2.0)
    brief = ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", retry_after_s=0.01)
    call = failing([busy, brief])
    assert run(call, RetryPolicy(budget_s=60, initial_backoff_s=0.2), clock) == "ok"
    assert clock.sleeps == [2.0, 0.4]


def test_gives_up_with_the_last_error_when_the_next_wait_would_pass_the_budget():
    clock = Clock()
    errors = [unavailable() for _ in range(10)]
    last = errors[2]
    call = failing(errors)
    with pytest.raises(UnavailableError) as raised:
        run(call, RetryPolicy(budget_s=3.0, initial_backoff_s=1.0, max_backoff_s=10), clock)
    # Waits 1 + 2 = 3 s fit the budget; the third failure would wait 4 s more.
    assert clock.sleeps == [1.0, 2.0] and call.calls == 3 and raised.value is last


def test_a_zero_budget_makes_one_attempt():
    clock = Clock()
    call = failing([unavailable()])
    with pytest.raises(UnavailableError):
        run(call, RetryPolicy(budget_s=0), clock)
    assert call.calls == 1


def test_a_caller_may_add_its_own_transient_errors(caplog):
    class NoReplica(RuntimeError):
        pass

    clock = Clock()
    call = failing([NoReplica("none serves version 3"), unavailable()])
    retryable = lambda error: isinstance(error, NoReplica | UnavailableError)  # noqa: E731
    with caplog.at_level("WARNING"):
        assert run(call, RetryPolicy(budget_s=60), clock, retryable=retryable, what="generation") == "ok"
    assert [r.getMessage() for r in caplog.records] == [
        "generation failed (none serves version 3); retrying in 0.5 s",
        "generation failed (UNAVAILABLE: down); retrying in 1.0 s",
    ]
