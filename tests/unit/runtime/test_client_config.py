"""Channel options and the retry service config built from ChannelConfig."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from grpo_runtime.client import ChannelConfig, channel_options, service_config


def test_service_config_retries_unavailable_without_wait_for_ready():
    config = service_config(ChannelConfig(target="h:1", retry_max_attempts=4, retry_initial_backoff_s=0.5))
    (method,) = config["methodConfig"]
    assert method["name"] == [{}] and method["waitForReady"] is False
    assert method["retryPolicy"] == {
        "maxAttempts": 4,
        "initialBackoff": "0.5s",
        "maxBackoff": "2.0s",
        "backoffMultiplier": 2.0,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert (
        "retryPolicy"
        not in service_config(ChannelConfig(target="h:1", retry_max_attempts=1))["methodConfig"][0]
    )


def test_channel_options_carry_limits_keepalive_and_the_service_config():
    options = dict(
        channel_options(ChannelConfig(target="h:1", max_message_bytes=1 << 20, tls_server_name="svc"))
    )
    assert options["grpc.max_send_message_length"] == options["grpc.max_receive_message_length"] == 1 << 20
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.enable_retries"] == 1
    assert options["grpc.ssl_target_name_override"] == "svc"
    assert json.loads(options["grpc.service_config"])["methodConfig"][0]["retryPolicy"]["maxAttempts"] == 5


def test_channel_config_validation(tmp_path):
    with pytest.raises(ValidationError, match="retry_max_attempts"):
        ChannelConfig(target="h:1", retry_max_attempts=6)
    with pytest.raises(ValidationError, match="must be set together"):
        ChannelConfig(target="h:1", tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="Extra inputs"):
        ChannelConfig(target="h:1", tokn="x")
    assert not ChannelConfig(target="h:1").secure
    assert ChannelConfig(target="h:1", tls_ca_file=tmp_path / "ca.pem").secure


def test_round_robin_spreads_over_resolved_addresses():
    assert service_config(ChannelConfig(target="x:1"))["loadBalancingConfig"] == [{"pick_first": {}}]
    config = ChannelConfig(target="dns:///rollout-headless:50052", load_balancing="round_robin")
    assert service_config(config)["loadBalancingConfig"] == [{"round_robin": {}}]
    with pytest.raises(ValidationError, match="load_balancing"):
        ChannelConfig(target="x:1", load_balancing="random")
