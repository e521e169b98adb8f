"""Domain errors carry their status code and "field: message" details."""

from __future__ import annotations

import grpc
import pytest

from grpo_runtime import errors


@pytest.mark.parametrize(
    ("error_type", "code"),
    [
        (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.NotFound, grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
        (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
        (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Aborted, grpc.StatusCode.ABORTED),
        (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
        (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
        (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
        (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    ],
)
def test_each_error_has_its_status_code(error_type, code):
    error = error_type("bad")
    assert isinstance(error, errors.ServiceError)
    assert error.code == code


def test_details_name_the_field_when_given():
    assert errors.InvalidArgument("must be >= 1", field="n").details == "n: must be >= 1"
    assert str(errors.NotFound("no such run", field="run_id")) == "run_id: no such run"
    assert errors.Unavailable("engine starting").details == "engine starting"
    error = errors.InvalidArgument("empty role", field="prompts[2].messages[0].role")
    assert (error.field, error.message) == ("prompts[2].messages[0].role", "empty role")


def test_details_quoting_hostile_input_stay_within_the_metadata_limit():
    error = errors.InvalidArgument(f"unknown reward {'x' * 100_000!r}", field="rewards[0].name")
    assert error.details.startswith("rewards[0].name: unknown reward 'xxx")
    assert len(error.details) <= errors.MAX_DETAILS_CHARS + 3
    assert str(error) == error.details
