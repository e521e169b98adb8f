"""The images start hardened, answer health and reflection, and the reward image scores from the host."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.common.v1 import common_pb2
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc
from testcontainers.core.network import Network

from tests.containers.service_containers import CONTAINER_UID, Running, launch_service, wait_all_serving

DEMO_MODEL = "/opt/grpo/models/demo"


@pytest.fixture(scope="module")
def trio(images: dict[str, str], network: Network) -> Iterator[dict[str, Running]]:
    started: dict[str, Running] = {}
    try:
        started["reward"] = launch_service(images["reward"], "reward", network, [])
        started["rollout"] = launch_service(
            images["rollout"], "rollout", network, ["--model", DEMO_MODEL, "--engine", "hf"]
        )
        started["trainer"] = launch_service(images["trainer"], "trainer", network, [])
        wait_all_serving(started.values())
        yield started
    finally:
        for running in started.values():
            running.remove()


@pytest.mark.parametrize("name", ["reward", "rollout", "trainer"])
def test_each_service_is_serving(trio: dict[str, Running], name: str) -> None:
    service = f"grpo.{name}.v1.{name.capitalize()}Service"
    with grpc.insecure_channel(trio[name].address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for probe in ("", service):
            status = health.Check(health_pb2.HealthCheckRequest(service=probe), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, (name, probe)


def test_score_from_the_host(trio: dict[str, Running]) -> None:
    metadata = struct_pb2.Struct()
    metadata.update({"answer": "42"})
    request = reward_pb2.ScoreRequest(
        samples=[
            reward_pb2.Sample(
                id="right",
                prompt=[common_pb2.ChatMessage(role="user", content="What is 6 * 7?")],
                completion="The answer is $\\boxed{42}$.",
                metadata=metadata,
            ),
            reward_pb2.Sample(id="wrong", completion="The answer is $\\boxed{41}$.", metadata=metadata),
        ],
        rewards=[reward_pb2.RewardSpec(name="accuracy")],
    )
    with grpc.insecure_channel(trio["reward"].address) as channel:
        response = reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=60)
    assert [s.id for s in response.scores] == ["right", "wrong"]
    assert [s.reward for s in response.scores] == [1.0, 0.0]


@pytest.mark.parametrize("name", ["reward", "rollout", "trainer"])
def test_runs_as_non_root_on_a_read_only_root(trio: dict[str, Running], name: str) -> None:
    container = trio[name].container
    container.reload()
    assert container.attrs["HostConfig"]["ReadonlyRootfs"] is True
    uid = container.exec_run(["id", "-u"], user="").output.decode().strip()
    assert uid == CONTAINER_UID
    denied = container.exec_run(["touch", "/opt/venv/written"])
    assert denied.exit_code != 0 and b"Read-only file system" in denied.output
    assert container.exec_run(["touch", "/tmp/written"]).exit_code == 0


def test_images_carry_labels_and_healthcheck(trio: dict[str, Running]) -> None:
    for running in trio.values():
        container = running.container
        config = container.image.attrs["Config"]
        assert config["Labels"]["org.opencontainers.image.title"].startswith("grpo-services")
        assert "grpo_runtime.healthcheck" in " ".join(config["Healthcheck"]["Test"])
        assert config["User"] == CONTAINER_UID
        binaries = container.exec_run(["ls", "/usr/bin"]).output.split()
        assert b"gcc" not in binaries and b"cc" not in binaries, "build tools left in the image"
