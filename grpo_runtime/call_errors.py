"""What a client of the services raises when a call fails: one error family, built in one place.

Every client (``RewardClient``, ``RolloutClient``, ``TrainerClient``) turns a failed call's
``grpc.RpcError`` into a :class:`ServiceCallError` with :func:`call_error` (as TGI's client does with
``parse_error``), so callers catch one family and never gRPC's own type. The subclass says what happened,
by status code::

    try:
        client.score(samples, rewards)
    except InvalidArgumentError as error:     # error.field == "samples[3].completion"
        ...
    except ServiceCallError as error:         # any other status; error.code, error.details
        ...

The servers' status details are ``"<field>: <message>"`` when the error names a field
(:class:`grpo_runtime.errors.ServiceError`); :func:`call_error` splits them back into ``field`` and
``message``. A RESOURCE_EXHAUSTED carrying gRPC's pushback trailer (a transient concurrency bound) has its
wait in ``retry_after_s``.
"""

from __future__ import annotations

import re
from typing import ClassVar

import grpc

from grpo_runtime.errors import RETRY_PUSHBACK_KEY

# Codes of a service that is down, restarting or too slow to answer in time: worth another attempt later.
# RESOURCE_EXHAUSTED is retryable only with the server's pushback (ServiceCallError.retryable).
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

# A field path as the servers write it: dotted names, indices in brackets (``prompts[2].messages[0].role``).
_FIELD_PREFIX = re.compile(
    r"(?P<field>[A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*): (?P<message>.*)", re.S
)


class ServiceCallError(RuntimeError):
    """A call to a service failed with status ``code``.

    ``details``: the status details as sent; ``field``/``message``: the field they name and the rest (field
    None when they name none); ``retry_after_s``: the server's pushback in seconds (RESOURCE_EXHAUSTED that
    goes away by itself), else None; ``service``: who was called ("reward service"), prefixed to the text.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    codes: ClassVar[tuple[grpc.StatusCode, ...]] = ()

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        *,
        service: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.code = code
        self.details = details
        self.service = service
        self.retry_after_s = retry_after_s
        match = _FIELD_PREFIX.fullmatch(details)
        self.field = match["field"] if match else None
        self.message = match["message"] if match else details
        prefix = f"{service}: " if service else ""
        super().__init__(f"{prefix}{code.name}: {details}")

    @property
    def retryable(self) -> bool:
        """Whether waiting and calling again may succeed: :data:`RETRYABLE_CODES`, or a pushback."""
        return self.code in RETRYABLE_CODES or self.retry_after_s is not None


class InvalidArgumentError(ServiceCallError):
    """The request is malformed; ``field`` names the offending field when the server named one."""

    codes = (grpc.StatusCode.INVALID_ARGUMENT,)


class NotFoundError(ServiceCallError):
    codes = (grpc.StatusCode.NOT_FOUND,)


class AlreadyExistsError(ServiceCallError):
    codes = (grpc.StatusCode.ALREADY_EXISTS,)


class FailedPreconditionError(ServiceCallError):
    """The service is not in a state that allows the call (an engine asleep, weights discarded)."""

    codes = (grpc.StatusCode.FAILED_PRECONDITION,)


class OutOfRangeError(ServiceCallError):
    codes = (grpc.StatusCode.OUT_OF_RANGE,)


class ResourceExhaustedError(ServiceCallError):
    """A quota or capacity is used up; retryable only when ``retry_after_s`` is set."""

    codes = (grpc.StatusCode.RESOURCE_EXHAUSTED,)


class AbortedError(ServiceCallError):
    codes = (grpc.StatusCode.ABORTED,)


class UnavailableError(ServiceCallError):
    """The service is down, restarting or unreachable."""

    codes = (grpc.StatusCode.UNAVAILABLE,)


class DeadlineExceededError(ServiceCallError):
    """The call did not finish within its deadline."""

    codes = (grpc.StatusCode.DEADLINE_EXCEEDED,)


class CallCancelledError(ServiceCallError):
    codes = (grpc.StatusCode.CANCELLED,)


class UnauthenticatedError(ServiceCallError):
    """An admin call without a valid token."""

    codes = (grpc.StatusCode.UNAUTHENTICATED,)


class PermissionDeniedError(ServiceCallError):
    codes = (grpc.StatusCode.PERMISSION_DENIED,)


class UnimplementedError(ServiceCallError):
    codes = (grpc.StatusCode.UNIMPLEMENTED,)


class InternalError(ServiceCallError):
    """The service failed in a way it did not expect (INTERNAL, UNKNOWN, DATA_LOSS)."""

    codes = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS)


_CLASS_OF = {code: kind for kind in ServiceCallError.__subclasses__() for code in kind.codes}
_CODE_OF_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def pushback_s(error: grpc.RpcError) -> float | None:
    """The wait (s) the server's ``grpc-retry-pushback-ms`` trailer asks for, or None without a valid one."""
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == RETRY_PUSHBACK_KEY:
            try:
                return max(0.0, int(value) / 1000)
            except ValueError:
                return None
    return None


def call_error(error: grpc.RpcError, service: str | None = None) -> ServiceCallError:
    """The :class:`ServiceCallError` subclass for a failed call's status (the base class for an OK or
    unknown code). A pushback is kept only on RESOURCE_EXHAUSTED, the one code the servers send it with."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or ""
    retry_after_s = pushback_s(error) if code == grpc.StatusCode.RESOURCE_EXHAUSTED else None
    return status_error(code, details, service, retry_after_s=retry_after_s)


def status_error(
    code: grpc.StatusCode | int,
    details: str,
    service: str | None = None,
    *,
    retry_after_s: float | None = None,
) -> ServiceCallError:
    """The :class:`ServiceCallError` subclass for a status given as its parts; ``code`` as gRPC's enum or
    its number (an entry of a batch call carries the number; an unknown number is UNKNOWN)."""
    if isinstance(code, int):
        code = _CODE_OF_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    kind = _CLASS_OF.get(code, ServiceCallError)
    return kind(code, details, service=service, retry_after_s=retry_after_s)
