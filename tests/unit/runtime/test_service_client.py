"""What every service client shares: the channel opens at the first call, a client pickles as its settings,
and a failed call raises the typed error after the retries its budget allows."""

from __future__ import annotations

import pickle
import socket

import pytest

from grpo_runtime.call_errors import UnavailableError
from grpo_runtime.client import ServiceClient
from reward_service.client import RewardClient
from rollout_service.client import RolloutClient
from trainer_service.client import TrainerClient


@pytest.fixture
def dead_target() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once closed
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("kind", [RewardClient, RolloutClient, TrainerClient])
def test_clients_open_no_channel_until_called_and_pickle_as_settings(kind, dead_target):
    client = kind(dead_target, admin_token="secret", timeout_s=7.0)
    assert client._channel is None and client.target == dead_target
    client.channel  # noqa: B018 - opened on first use
    copy = pickle.loads(pickle.dumps(client))
    assert copy._channel is None and (copy.target, copy.timeout_s) == (dead_target, 7.0)
    assert copy._config.admin_token.get_secret_value() == "secret"
    client.close()
    assert client._channel is None


def test_a_dead_service_raises_unavailable_after_the_budget(dead_target, caplog):
    with ServiceClient(dead_target, retry_budget_s=0.0) as once, pytest.raises(UnavailableError) as failed:
        once.serving_status(timeout_s=5)
    assert failed.value.retryable and str(failed.value).startswith("service: UNAVAILABLE: ")
    assert not caplog.records
    with ServiceClient(dead_target, retry_budget_s=3.0) as retrying, pytest.raises(UnavailableError):
        retrying.serving_status(timeout_s=5)
    assert any("Check failed" in r.getMessage() and "retrying in" in r.getMessage() for r in caplog.records)


def test_wait_ready_raises_unavailable_when_nothing_answers(dead_target):
    with RolloutClient(dead_target) as client, pytest.raises(UnavailableError, match="did not connect"):
        client.wait_ready(timeout_s=0.5)
