"""A companion listener (the reward service's HTTP endpoint) follows the gRPC server's TLS settings: HTTPS
with its certificate, client certificates required under mutual TLS, nothing in plaintext."""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer, ServiceBinding
from reward_service.api.reward import RewardServicer
from reward_service.core.scorer import Scorer
from reward_service.core.stress import StressLimits
from reward_service.http.app import HttpEndpoint
from reward_service.http.settings import HttpSettings


def _server(**tls) -> tuple[GrpcServer, HttpEndpoint]:
    scorer = Scorer({}, None, max_concurrent=2)
    endpoint = HttpEndpoint(scorer, HttpSettings(port=0))
    binding = ServiceBinding(
        servicer=RewardServicer(scorer, 1, StressLimits()),
        add_to_server=reward_pb2_grpc.add_RewardServiceServicer_to_server,
        descriptor=reward_pb2.DESCRIPTOR.services_by_name["RewardService"],
        companions=(endpoint,),
    )
    return GrpcServer(ServerConfig(host="127.0.0.1", port=0, grace_period_s=0, **tls), [binding]), endpoint


async def _health(url: str, context: ssl.SSLContext | bool) -> int:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, ssl=context) as reply:
        return reply.status


async def test_https_with_the_servers_certificate_and_no_plaintext(certificates):
    server, endpoint = _server(tls_cert_file=certificates.server_cert, tls_key_file=certificates.server_key)
    async with server:
        trusted = ssl.create_default_context(cafile=str(certificates.ca))
        assert await _health(f"https://127.0.0.1:{endpoint.port}/health", trusted) == 200
        with pytest.raises(aiohttp.ClientError):
            await _health(f"http://127.0.0.1:{endpoint.port}/health", False)
        with pytest.raises(aiohttp.ClientError):  # TLS trusting only the system roots
            await _health(f"https://127.0.0.1:{endpoint.port}/health", ssl.create_default_context())


async def test_mutual_tls_requires_a_client_certificate(certificates):
    server, endpoint = _server(
        tls_cert_file=certificates.server_cert,
        tls_key_file=certificates.server_key,
        tls_client_ca_file=certificates.ca,
    )
    async with server:
        url = f"https://127.0.0.1:{endpoint.port}/health"
        without = ssl.create_default_context(cafile=str(certificates.ca))
        with pytest.raises(aiohttp.ClientError):
            await _health(url, without)
        with_cert = ssl.create_default_context(cafile=str(certificates.ca))
        with_cert.load_cert_chain(str(certificates.client_cert), str(certificates.client_key))
        assert await _health(url, with_cert) == 200
