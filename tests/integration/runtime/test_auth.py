"""Admin RPCs (proto option ``(grpo.common.v1.admin)``) need the bearer token when one is configured."""

from __future__ import annotations

import logging

import grpc
import pytest
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_channel

TOKEN = "s3cret-token"


async def _sleep(server, token: str | None, metadata=None) -> rollout_pb2.SleepResponse:
    async with create_channel(ChannelConfig(target=server.address, admin_token=token)) as channel:
        return await rollout_pb2_grpc.RolloutServiceStub(channel).Sleep(
            rollout_pb2.SleepRequest(level=2), metadata=metadata
        )


async def test_admin_rpc_without_token_is_unauthenticated(start_server):
    server = await start_server(admin_token=TOKEN)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _sleep(server, token=None)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer" in error.value.details()


async def test_admin_rpc_with_a_wrong_token_or_scheme_is_unauthenticated(start_server):
    server = await start_server(admin_token=TOKEN)
    for token, metadata in [("wrong", None), (None, (("authorization", f"Basic {TOKEN}"),))]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await _sleep(server, token=token, metadata=metadata)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_admin_rpc_with_the_token_reaches_the_servicer(start_server):
    server = await start_server(admin_token=TOKEN)
    assert (await _sleep(server, token=TOKEN)).level == 2


async def test_public_rpc_needs_no_token(start_server):
    server = await start_server(admin_token=TOKEN)
    async with create_channel(server.address) as channel:
        reply = await rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(rollout_pb2.GetStatusRequest())
    assert reply.engine == "test"


async def test_client_streaming_admin_rpc_is_protected_too(start_server):
    server = await start_server(admin_token=TOKEN)
    chunks = [rollout_pb2.WeightChunk(version=1, data=b"abc")]
    for token, expected in [(None, grpc.StatusCode.UNAUTHENTICATED), (TOKEN, None)]:
        async with create_channel(ChannelConfig(target=server.address, admin_token=token)) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            if expected is None:
                assert (await stub.UpdateWeights(iter(chunks))).bytes_received == 3
            else:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await stub.UpdateWeights(iter(chunks))
                assert error.value.code() == expected


async def test_token_from_the_environment(start_server, monkeypatch):
    monkeypatch.setenv("GRPO_ADMIN_TOKEN", "from-env")
    server = await start_server()
    with pytest.raises(grpc.aio.AioRpcError):
        await _sleep(server, token=None)
    assert (await _sleep(server, token="from-env")).level == 2


async def test_token_from_a_file_is_stripped(start_server, monkeypatch, tmp_path):
    monkeypatch.delenv("GRPO_ADMIN_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    server = await start_server(admin_token_file=token_file)
    with pytest.raises(grpc.aio.AioRpcError):
        await _sleep(server, token=None)
    assert (await _sleep(server, token="from-file")).level == 2


async def test_without_a_token_admin_rpcs_are_open_and_a_warning_says_so(start_server, monkeypatch, caplog):
    monkeypatch.delenv("GRPO_ADMIN_TOKEN", raising=False)
    with caplog.at_level(logging.WARNING, logger="grpo_runtime.server"):
        server = await start_server()
    assert (await _sleep(server, token=None)).level == 2
    assert any("admin RPCs are open" in r.getMessage() for r in caplog.records)
