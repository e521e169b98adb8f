"""Server channel arguments derived from ServerConfig, and ServiceBinding checks."""

from __future__ import annotations

import pytest
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.config import MiB, ServerConfig
from grpo_runtime.server import GrpcServer, ServiceBinding, server_options


def test_message_limits_and_keepalive_reach_the_server_options():
    options = dict(
        server_options(
            ServerConfig(
                max_message_bytes=8 * MiB,
                keepalive_time_ms=5000,
                keepalive_timeout_ms=1000,
                min_ping_interval_without_data_ms=2000,
                max_connection_age_ms=60_000,
                max_connection_age_grace_ms=5000,
            )
        )
    )
    assert options["grpc.max_send_message_length"] == options["grpc.max_receive_message_length"] == 8 * MiB
    assert options["grpc.keepalive_time_ms"] == 5000
    assert options["grpc.keepalive_timeout_ms"] == 1000
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 2000
    assert options["grpc.max_connection_age_ms"] == 60_000
    assert options["grpc.max_connection_age_grace_ms"] == 5000
    assert options["grpc.so_reuseport"] == 0


def test_connection_age_is_unlimited_by_default():
    assert "grpc.max_connection_age_ms" not in dict(server_options(ServerConfig()))


def _binding() -> ServiceBinding:
    return ServiceBinding(
        servicer=rollout_pb2_grpc.RolloutServiceServicer(),
        add_to_server=rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        descriptor=rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
    )


def test_a_server_needs_distinct_services():
    assert _binding().name == "grpo.rollout.v1.RolloutService"
    with pytest.raises(ValueError, match="at least one"):
        GrpcServer(ServerConfig(), [])
    with pytest.raises(ValueError, match="bound twice"):
        GrpcServer(ServerConfig(), [_binding(), _binding()])
    with pytest.raises(RuntimeError, match="not started"):
        _ = GrpcServer(ServerConfig(), [_binding()]).port
