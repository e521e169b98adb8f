"""Domain errors that the server runtime maps to gRPC status codes.

Servicers and domain cores raise these instead of calling ``context.abort``; the runtime's
interceptor turns them into a status with the details ``"<field>: <message>"`` (or just the
message when no field is named), so every service reports errors the same way::

    raise InvalidArgument("must be >= 1", field="n")   # INVALID_ARGUMENT, "n: must be >= 1"
"""

from __future__ import annotations

from typing import ClassVar

import grpc

# gRPC's trailer for "retry this call after N ms" (gRFC A6); the only RESOURCE_EXHAUSTED worth retrying.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
# Longest status details sent, in characters: well inside gRPC's 8 KiB metadata limit.
MAX_DETAILS_CHARS = 1000


class ServiceError(Exception):
    """Base of every error that becomes a specific gRPC status code.

    ``field`` names the request field (dotted path, indices in brackets: ``prompts[2].text``)
    or config key the error is about; it prefixes the status details.
    """

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    @property
    def details(self) -> str:
        """The status details sent to the client: ``"field: message"`` or ``"message"``, cut to
        :data:`MAX_DETAILS_CHARS` (a message may quote hostile input, and details past gRPC's 8 KiB
        metadata limit would reach the client as a different status)."""
        details = f"{self.field}: {self.message}" if self.field else self.message
        return details if len(details) <= MAX_DETAILS_CHARS else f"{details[:MAX_DETAILS_CHARS]}..."

    def __str__(self) -> str:
        return self.details


class InvalidArgument(ServiceError):
    """The request is malformed: a field is missing, out of range or inconsistent."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    """A named entity (model, run, checkpoint) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    """An entity with that name already exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServiceError):
    """The system is not in a state that allows the call (for example an engine asleep)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(ServiceError):
    """A value is past the valid range of the current state (for example a stale version)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhausted(ServiceError):
    """A quota or capacity is used up (queue full, memory, too many runs).

    ``retry_after_s`` marks a refusal that goes away by itself (a concurrency bound): the interceptor sends it
    as gRPC's ``grpc-retry-pushback-ms`` trailer, and clients retry only such refusals. A request over a size
    limit carries none, so it fails at once instead of being retried until a budget runs out.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class Aborted(ServiceError):
    """The call lost a concurrency race (for example a concurrent weight update); retry."""

    code = grpc.StatusCode.ABORTED


class DeadlineExceeded(ServiceError):
    """Something the call waits for did not happen within the time the request allows (a group that did
    not form within its timeout)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(ServiceError):
    """The service is starting or shutting down, or a dependency is unreachable; retry."""

    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServiceError):
    """The call lacks valid credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    """The caller is known but not allowed to do this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unimplemented(ServiceError):
    """The RPC or the requested option is not supported by this server or engine."""

    code = grpc.StatusCode.UNIMPLEMENTED
