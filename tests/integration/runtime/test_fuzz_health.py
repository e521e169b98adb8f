"""Property-based fuzzing of the shared runtime: arbitrary bytes as the request of every method, and
arbitrary health service names, never get INTERNAL/UNKNOWN, and the server stays SERVING."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.server_thread import server_thread

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
METHODS = {
    "/grpo.rollout.v1.RolloutService/Generate": "unary_unary",
    "/grpo.rollout.v1.RolloutService/GetStatus": "unary_unary",
    "/grpo.rollout.v1.RolloutService/Sleep": "unary_unary",
    "/grpo.rollout.v1.RolloutService/UpdateWeights": "stream_unary",
    "/grpo.trainer.v1.TrainerService/WatchRun": "unary_stream",
    "/grpc.health.v1.Health/Check": "unary_unary",
}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def channel(test_service) -> Iterator[grpc.Channel]:
    async def build():
        return test_service.bindings(), None

    with server_thread(build) as server, grpc.insecure_channel(server.address) as channel:
        yield channel


def _call(channel: grpc.Channel, method: str, kind: str, payloads: list[bytes]) -> grpc.StatusCode:
    try:
        if kind == "unary_unary":
            channel.unary_unary(method)(payloads[0], timeout=5)
        elif kind == "stream_unary":
            channel.stream_unary(method)(iter(payloads), timeout=5)
        else:
            list(channel.unary_stream(method)(payloads[0], timeout=5))
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


@FUZZ
@given(
    method=st.sampled_from(sorted(METHODS)),
    payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=3),
)
def test_arbitrary_bytes_never_make_the_server_fail(channel, method, payloads):
    code = _call(channel, method, METHODS[method], payloads)
    assert code in ALLOWED, (method, payloads, code)
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@FUZZ
@given(service=st.text(max_size=60))
def test_health_of_any_service_name_is_known_or_not_found(channel, service):
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND
    else:
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
