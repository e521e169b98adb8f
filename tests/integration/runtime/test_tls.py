"""TLS and mutual TLS with certificates generated in the test (see conftest.certificates)."""

from __future__ import annotations

import grpc
import pytest
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_channel


async def _status(cfg: ChannelConfig) -> rollout_pb2.GetStatusResponse:
    async with create_channel(cfg) as channel:
        return await rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(rollout_pb2.GetStatusRequest())


def _client(server, **fields) -> ChannelConfig:
    # One attempt and a short deadline: a refused handshake should fail fast, not retry.
    return ChannelConfig(target=server.address, retry_max_attempts=1, default_timeout_s=5, **fields)


async def test_tls_round_trip_with_a_self_signed_ca(start_server, certificates):
    server = await start_server(tls_cert_file=certificates.server_cert, tls_key_file=certificates.server_key)
    assert (await _status(_client(server, tls_ca_file=certificates.ca))).engine == "test"
    # The certificate also names localhost.
    by_name = ChannelConfig(
        target=f"localhost:{server.port}", tls_ca_file=certificates.ca, default_timeout_s=5
    )
    assert (await _status(by_name)).engine == "test"


async def test_tls_server_refuses_plaintext_and_untrusted_clients(start_server, certificates):
    server = await start_server(tls_cert_file=certificates.server_cert, tls_key_file=certificates.server_key)
    for cfg in (_client(server), _client(server, tls=True)):  # plaintext; TLS trusting only system roots
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await _status(cfg)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_rejects_a_client_without_a_certificate_and_accepts_one_with(
    start_server, certificates
):
    server = await start_server(
        tls_cert_file=certificates.server_cert,
        tls_key_file=certificates.server_key,
        tls_client_ca_file=certificates.ca,
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await _status(_client(server, tls_ca_file=certificates.ca))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    with_cert = _client(
        server,
        tls_ca_file=certificates.ca,
        tls_cert_file=certificates.client_cert,
        tls_key_file=certificates.client_key,
    )
    assert (await _status(with_cert)).engine == "test"
