"""A failed call's status becomes one typed client error: its subclass, field, message and pushback."""

from __future__ import annotations

import grpc
import pytest

from grpo_runtime import call_errors
from grpo_runtime.call_errors import ServiceCallError, call_error
from grpo_runtime.errors import RETRY_PUSHBACK_KEY, InvalidArgument


class FailedCall(grpc.RpcError):
    """What a blocking stub raises: gRPC's RpcError with the call's status (grpc._channel._InactiveRpcError
    offers the same three methods)."""

    def __init__(self, code: grpc.StatusCode, details: str = "", trailers: tuple = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, call_errors.InvalidArgumentError),
        (grpc.StatusCode.NOT_FOUND, call_errors.NotFoundError),
        (grpc.StatusCode.ALREADY_EXISTS, call_errors.AlreadyExistsError),
        (grpc.StatusCode.FAILED_PRECONDITION, call_errors.FailedPreconditionError),
        (grpc.StatusCode.OUT_OF_RANGE, call_errors.OutOfRangeError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, call_errors.ResourceExhaustedError),
        (grpc.StatusCode.ABORTED, call_errors.AbortedError),
        (grpc.StatusCode.UNAVAILABLE, call_errors.UnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, call_errors.DeadlineExceededError),
        (grpc.StatusCode.CANCELLED, call_errors.CallCancelledError),
        (grpc.StatusCode.UNAUTHENTICATED, call_errors.UnauthenticatedError),
        (grpc.StatusCode.PERMISSION_DENIED, call_errors.PermissionDeniedError),
        (grpc.StatusCode.UNIMPLEMENTED, call_errors.UnimplementedError),
        (grpc.StatusCode.INTERNAL, call_errors.InternalError),
        (grpc.StatusCode.UNKNOWN, call_errors.InternalError),
        (grpc.StatusCode.DATA_LOSS, call_errors.InternalError),
    ],
)
def test_each_status_code_has_its_error_class(code, kind):
    error = call_error(FailedCall(code, "went wrong"), "reward service")
    assert type(error) is kind and isinstance(error, ServiceCallError)
    assert not isinstance(error, grpc.RpcError)  # callers catch one family, never gRPC's own type
    assert (error.code, error.details, error.service) == (code, "went wrong", "reward service")
    assert str(error) == f"reward service: {code.name}: went wrong"


def test_every_status_code_but_ok_is_mapped():
    assert {code for code in grpc.StatusCode if code != grpc.StatusCode.OK} == set(call_errors._CLASS_OF)


def test_the_field_the_server_named_is_parsed_back():
    # What the server runtime sends for a domain error naming a field.
    sent = InvalidArgument("must be a finite number", field="samples[0].metadata.x[1].y").details
    error = call_error(FailedCall(grpc.StatusCode.INVALID_ARGUMENT, sent))
    assert (error.field, error.message) == ("samples[0].metadata.x[1].y", "must be a finite number")
    assert str(error) == f"INVALID_ARGUMENT: {sent}"


@pytest.mark.parametrize(
    "details",
    [
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect",
        "Deadline Exceeded",
        "3 Generate calls are in flight: retry later",
        "",
    ],
)
def test_details_without_a_field_keep_it_none(details):
    error = call_error(FailedCall(grpc.StatusCode.UNAVAILABLE, details))
    assert error.field is None and error.message == details


def test_pushback_is_read_only_on_resource_exhausted():
    trailers = ((RETRY_PUSHBACK_KEY, "250"),)
    refused = call_error(FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", trailers))
    assert refused.retry_after_s == 0.25 and refused.retryable
    too_big = call_error(FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_samples=8"))
    assert too_big.retry_after_s is None and not too_big.retryable
    garbled = call_error(FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", ((RETRY_PUSHBACK_KEY, "x"),)))
    assert garbled.retry_after_s is None
    other = call_error(FailedCall(grpc.StatusCode.ABORTED, "race", trailers))
    assert other.retry_after_s is None and not other.retryable


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_retryable_codes_are_unavailable_and_deadline_exceeded(code):
    error = call_error(FailedCall(code, "x"))
    assert error.retryable == (code in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
