"""A port the launcher picked can be taken before the service binds it (seconds later, after its imports):
the service exits with EXIT_BIND_ERROR and starts again on a fresh port; a port the caller chose is not
retried, and another exit is not mistaken for a taken port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from reward_service.client import RewardClient
from trainer_service.local import launcher
from trainer_service.local.launcher import ServiceExited, start_local_services, start_service


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another process's listener holds for the test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def first_pick_taken(monkeypatch, taken_port) -> list[int]:
    """``free_port`` answers the taken port first, then free ones; returns every port it gave out."""
    picked: list[int] = []
    real = launcher.free_port

    def pick(host: str = "127.0.0.1") -> int:
        picked.append(taken_port if not picked else real(host))
        return picked[-1]

    monkeypatch.setattr(launcher, "free_port", pick)
    return picked


def test_a_service_whose_picked_port_was_taken_starts_on_a_fresh_one(first_pick_taken, taken_port, tmp_path):
    service = start_service("reward_service", log_dir=tmp_path)
    try:
        assert first_pick_taken[0] == taken_port and len(first_pick_taken) == 2
        assert service.target == f"127.0.0.1:{first_pick_taken[1]}"
        with RewardClient(service.target, timeout_s=30) as client:
            assert client.serving_status() == "SERVING"
    finally:
        service.stop()
    assert f"cannot bind 127.0.0.1:{taken_port}" in (tmp_path / "reward_service.log").read_text()


def test_local_services_start_again_when_a_picked_port_was_taken(first_pick_taken, taken_port, tiny_models):
    with start_local_services(need_reward=True, need_rollout=False, model=tiny_models["policy"]) as services:
        assert services.reward_target == f"127.0.0.1:{first_pick_taken[-1]}" != f"127.0.0.1:{taken_port}"
        with RewardClient(services.reward_target, timeout_s=30) as client:
            assert client.serving_status() == "SERVING"


def test_a_port_the_caller_chose_is_not_retried(first_pick_taken, taken_port):
    with pytest.raises(ServiceExited) as exited:
        start_service("reward_service", port=taken_port)
    assert exited.value.port_taken and first_pick_taken == []


def test_another_exit_is_not_taken_for_a_taken_port(first_pick_taken):
    """A service failing for its own reason (here a config error, exit 2) is started once."""
    with pytest.raises(ServiceExited) as exited:
        start_service("reward_service", ["--config", "/nonexistent/reward.yaml"])
    assert exited.value.returncode == 2 and not exited.value.port_taken
    assert len(first_pick_taken) == 1
