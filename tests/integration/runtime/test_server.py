"""The shared server against real channels: health, reflection, error mapping, logs, limits, shutdown."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_channel
from grpo_runtime.config import ServerConfig
from grpo_runtime.logging_setup import JsonFormatter
from grpo_runtime.server import BindError, GrpcServer

ROLLOUT = "grpo.rollout.v1.RolloutService"
TRAINER = "grpo.trainer.v1.TrainerService"


def generate(text: str) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(prompts=[rollout_pb2.Prompt(id="p0", text=text)], n=1)


async def wait_in_flight(server, method: str = "Generate", timeout_s: float = 10) -> None:
    """Wait until the server handles a call of ``method`` (its in-flight gauge is 1)."""
    deadline = time.monotonic() + timeout_s
    labels = {"service": ROLLOUT, "method": method}
    while server.metrics.registry.get_sample_value("grpo_rpc_in_flight", labels) != 1:
        assert time.monotonic() < deadline, f"no {method} call in flight"
        await asyncio.sleep(0.01)


async def test_health_is_serving_for_the_server_and_each_service(start_server):
    server = await start_server()
    async with create_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", ROLLOUT, TRAINER):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await health.Check(health_pb2.HealthCheckRequest(service="grpo.nope.v1.Nope"))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_every_service_and_describes_them(start_server):
    server = await start_server()
    async with create_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=ROLLOUT),
        ]
        replies = [reply async for reply in stub.ServerReflectionInfo(iter(requests))]
    listed = {s.name for s in replies[0].list_services_response.service}
    assert listed == {ROLLOUT, TRAINER, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
    assert replies[1].file_descriptor_response.file_descriptor_proto, "no descriptor for the service"


async def test_service_error_becomes_its_code_with_field_and_message(start_server):
    server = await start_server()
    async with create_channel(server.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.Generate(generate("invalid"))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "prompts[0].text: must not be 'invalid'"
    # Errors carry the request id in the trailers (headers are only sent with a response).
    assert dict(error.value.trailing_metadata())["x-request-id"]


async def test_unexpected_exception_is_internal_with_its_text_and_logged(start_server, caplog):
    server = await start_server()
    async with create_channel(server.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with caplog.at_level(logging.INFO, logger="grpo_runtime.access"):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.Generate(generate("crash"))
            # The server still answers afterwards.
            assert (await stub.Generate(generate("hi"))).completions[0].text == "hi"
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert error.value.details() == "RuntimeError: engine exploded"
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert failures[0].code == "INTERNAL"


async def test_rpc_the_servicer_does_not_implement_answers_unimplemented(start_server):
    server = await start_server()
    async with create_channel(server.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.WakeUp(rollout_pb2.WakeUpRequest())
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_server_streaming_delivers_events_then_maps_a_mid_stream_error(start_server):
    server = await start_server()
    async with create_channel(server.address) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        call = stub.WatchRun(trainer_pb2.WatchRunRequest(run_id="r1"))
        assert [event.step async for event in call] == [0, 1, 2]
        assert (await call.initial_metadata())["x-request-id"]

        call = stub.WatchRun(trainer_pb2.WatchRunRequest(run_id="missing"))
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as error:
            async for event in call:
                received.append(event.step)
    assert received == [0]
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error.value.details() == "run_id: no such run"


async def test_client_streaming_reaches_the_servicer(start_server):
    server = await start_server()
    chunks = [rollout_pb2.WeightChunk(version=1, data=b"x" * 1000) for _ in range(5)]
    async with create_channel(server.address) as channel:
        reply = await rollout_pb2_grpc.RolloutServiceStub(channel).UpdateWeights(iter(chunks))
    assert reply.bytes_received == 5000


async def test_request_id_is_echoed_and_in_every_json_log_line_of_the_call(start_server):
    server = await start_server()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        async with create_channel(server.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            call = stub.GetStatus(rollout_pb2.GetStatusRequest(), metadata=(("x-request-id", "req-42"),))
            assert (await call).engine == "test"
            # A unary response carries it with the status; a streamed one in its headers (above).
            assert dict(await call.trailing_metadata())["x-request-id"] == "req-42"
            assert "x-request-id" not in dict(await call.initial_metadata())
            generated = stub.GetStatus(rollout_pb2.GetStatusRequest())
            await generated
            assert re.fullmatch(r"[0-9a-f]{32}", dict(await generated.trailing_metadata())["x-request-id"])
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    ours = [line for line in lines if line.get("request_id") == "req-42"]
    by_logger = {line["logger"]: line for line in ours}
    domain, access = by_logger["runtime_test_service"], by_logger["grpo_runtime.access"]
    assert domain["message"] == "status requested"
    assert domain["service"] == ROLLOUT and domain["method"] == "GetStatus"
    assert access["code"] == "OK" and access["duration_ms"] >= 0
    assert {"time", "level", "logger", "message"} <= access.keys()


async def test_concurrent_calls_keep_their_own_request_id_across_awaits(start_server):
    server = await start_server()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    service_log = logging.getLogger("runtime_test_service")
    service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)
    try:
        async with create_channel(server.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            # Call i sleeps (9 - i) ms, so the calls finish in the reverse order of their start.
            await asyncio.gather(
                *(
                    stub.Generate(generate(f"sleep:0.00{9 - i}"), metadata=(("x-request-id", f"call-{i}"),))
                    for i in range(10)
                )
            )
    finally:
        service_log.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 10
    for line in lines:
        i = int(line["request_id"].removeprefix("call-"))
        assert line["message"] == f"generated sleep:0.00{9 - i}"


def _counter(metrics_text: str, method: str, code: str) -> float:
    pattern = rf'grpo_rpc_requests_total\{{code="{code}",method="{method}",service="{ROLLOUT}"\}} (\S+)'
    match = re.search(pattern, metrics_text)
    return float(match.group(1)) if match else 0.0


async def test_metrics_endpoint_counts_calls_and_errors_by_code(start_server):
    server = await start_server(metrics_port=0)
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    before = await asyncio.to_thread(scrape)
    async with create_channel(server.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        await stub.GetStatus(rollout_pb2.GetStatusRequest())
        await stub.GetStatus(rollout_pb2.GetStatusRequest())
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Generate(generate("invalid"))
    after = await asyncio.to_thread(scrape)
    assert _counter(after, "GetStatus", "OK") == _counter(before, "GetStatus", "OK") + 2
    assert _counter(after, "Generate", "INVALID_ARGUMENT") == 1
    assert f'grpo_rpc_duration_seconds_count{{method="GetStatus",service="{ROLLOUT}"}} 2.0' in after


async def test_message_over_the_limit_is_resource_exhausted_and_the_server_stays_up(start_server):
    server = await start_server(max_message_bytes=64 * 1024)
    # The client allows more, so the server's limit is the one tested.
    async with create_channel(ChannelConfig(target=server.address, max_message_bytes=1 << 24)) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as too_big_request:
            await stub.Generate(generate("x" * 100_000))
        with pytest.raises(grpc.aio.AioRpcError) as too_big_response:
            await stub.Generate(generate("big:100000"))
        assert (await stub.Generate(generate("small"))).completions[0].text == "small"
    assert too_big_request.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert too_big_response.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_default_limit_carries_messages_above_grpcs_4_mib(start_server):
    server = await start_server()
    async with create_channel(server.address) as channel:
        reply = await rollout_pb2_grpc.RolloutServiceStub(channel).Generate(generate("big:6000000"))
    assert len(reply.completions[0].text) == 6_000_000


async def test_max_concurrent_rpcs_refuses_the_excess(start_server):
    server = await start_server(max_concurrent_rpcs=1)
    async with create_channel(ChannelConfig(target=server.address, retry_max_attempts=1)) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        slow = asyncio.ensure_future(stub.Generate(generate("sleep:0.5")))
        await wait_in_flight(server)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.GetStatus(rollout_pb2.GetStatusRequest())
        assert (await slow).completions[0].text == "sleep:0.5"
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_stop_reports_not_serving_and_lets_in_flight_calls_finish(start_server):
    server = await start_server(grace_period_s=5)
    async with create_channel(server.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=ROLLOUT))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        slow = asyncio.ensure_future(stub.Generate(generate("sleep:0.8")))
        await wait_in_flight(server)
        started = time.monotonic()
        stopping = asyncio.ensure_future(server.stop())
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await watch.read() == grpc.aio.EOF  # the watch ends instead of holding the shutdown
        assert (await slow).completions[0].text == "sleep:0.8"
        await stopping
    # Finished with the in-flight call, well within the 5 s grace.
    assert time.monotonic() - started < 2.0


async def test_calls_still_running_after_the_grace_period_are_cancelled(start_server):
    server = await start_server()
    async with create_channel(ChannelConfig(target=server.address, retry_max_attempts=1)) as channel:
        slow = asyncio.ensure_future(
            rollout_pb2_grpc.RolloutServiceStub(channel).Generate(generate("sleep:30"))
        )
        await wait_in_flight(server)
        started = time.monotonic()
        await server.stop(grace_s=0.3)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await slow
    assert time.monotonic() - started < 3.0
    assert error.value.code() in {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE}


async def test_a_port_in_use_is_a_bind_error(start_server, test_service):
    first = await start_server()
    second = GrpcServer(ServerConfig(host="127.0.0.1", port=first.port), test_service.bindings())
    with pytest.raises(BindError, match=f"cannot bind 127.0.0.1:{first.port}"):
        await second.start()


async def test_an_undecodable_request_is_invalid_argument_not_internal(start_server):
    server = await start_server()
    truncated = b"\x0a\xff\x01"  # field 1, length 255, one byte of it
    async with create_channel(server.address) as channel:
        unary = channel.unary_unary(f"/{ROLLOUT}/Generate")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await unary(truncated)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details().startswith("request: cannot be decoded: DecodeError")
        streaming = channel.stream_unary(f"/{ROLLOUT}/UpdateWeights")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await streaming(iter([truncated]))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reply = await rollout_pb2_grpc.RolloutServiceStub(channel).Generate(generate("still fine"))
        assert reply.completions
