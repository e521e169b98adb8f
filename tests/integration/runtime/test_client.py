"""The channel factory: retry on UNAVAILABLE, default deadlines, token on sync channels."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_channel, create_sync_channel


def generate(text: str) -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(prompts=[rollout_pb2.Prompt(id="p0", text=text)], n=1)


async def test_unavailable_answers_are_retried_by_the_service_config(start_server):
    server = await start_server()
    # The servicer answers UNAVAILABLE twice per key, then succeeds.
    async with create_channel(ChannelConfig(target=server.address, retry_initial_backoff_s=0.01)) as channel:
        reply = await rollout_pb2_grpc.RolloutServiceStub(channel).Generate(generate("flaky:retried"))
    assert reply.completions[0].text == "flaky:retried"
    async with create_channel(ChannelConfig(target=server.address, retry_max_attempts=1)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await rollout_pb2_grpc.RolloutServiceStub(channel).Generate(generate("flaky:once"))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_server_started_after_the_first_attempt_is_reached_by_a_retry(start_server):
    probe = await start_server()
    port = probe.port
    await probe.stop(grace_s=0)  # the port is now free and known
    # Fast reconnects, and retries spread over about a second, so one lands after the server is up.
    cfg = ChannelConfig(
        target=f"127.0.0.1:{port}",
        retry_initial_backoff_s=0.3,
        retry_max_backoff_s=1.0,
        reconnect_initial_backoff_ms=20,
        reconnect_max_backoff_ms=100,
    )
    async with create_channel(cfg) as channel:
        call = asyncio.ensure_future(
            rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)
        )
        await asyncio.sleep(0.05)
        await start_server(port=port)
        assert (await call).engine == "test"


async def test_default_timeout_applies_when_the_caller_sets_none(start_server):
    server = await start_server()
    async with create_channel(ChannelConfig(target=server.address, default_timeout_s=0.2)) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.Generate(generate("sleep:2"))
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # An explicit timeout wins over the default.
        assert (await stub.Generate(generate("sleep:0.3"), timeout=5)).completions[0].text == "sleep:0.3"


async def test_sync_channel_sends_the_token_streams_and_applies_the_default_deadline(start_server):
    server = await start_server(admin_token="tok")

    def calls() -> tuple[int, int]:
        cfg = ChannelConfig(target=server.address, admin_token="tok", default_timeout_s=5)
        with create_sync_channel(cfg) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            level = stub.Sleep(rollout_pb2.SleepRequest(level=1)).level
            sent = stub.UpdateWeights(iter([rollout_pb2.WeightChunk(data=b"ab")] * 3)).bytes_received
        with create_sync_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as error:
                rollout_pb2_grpc.RolloutServiceStub(channel).Sleep(rollout_pb2.SleepRequest(level=1))
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with create_sync_channel(ChannelConfig(target=server.address, default_timeout_s=0.2)) as channel:
            with pytest.raises(grpc.RpcError) as error:
                rollout_pb2_grpc.RolloutServiceStub(channel).Generate(generate("sleep:2"))
            assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        return level, sent

    level, sent = await asyncio.to_thread(calls)
    assert (level, sent) == (1, 6)
