"""The reward image's code sandbox with the shipped seccomp profile, and the slim image without torch."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import struct_pb2
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc
from testcontainers.core.network import Network

import docker
from tests.containers.service_containers import CONTAINER_UID, REPO, Running, start_service, wait_serving

HOSTILE = {
    "network": "import socket\nsocket.create_connection(('127.0.0.1', 50051), timeout=2)\nprint(3)",
    "secrets": "import os\nprint(open('/proc/1/environ').read())",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
}


@pytest.fixture(scope="module")
def sandboxed_reward(images) -> Iterator[Running]:
    """The reward container with docker/compose.yaml's options for the sandbox, started through the CLI, which
    reads the seccomp profile from its file as compose does."""
    command = [
        "docker", "run", "-d", "-p", "127.0.0.1::50051", "--read-only", "--tmpfs", "/tmp",
        "--user", f"{CONTAINER_UID}:{CONTAINER_UID}", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges:true",
        "--security-opt", f"seccomp={REPO / 'docker' / 'seccomp' / 'reward-sandbox.json'}",
        images["reward"], "--host", "0.0.0.0", "--port", "50051",
    ]  # fmt: skip
    started = subprocess.run(command, check=True, capture_output=True, text=True)
    running = Running(docker.from_env().containers.get(started.stdout.strip()), "reward")
    try:
        wait_serving(running)
        yield running
    finally:
        running.remove()


def code_sample(sample_id: str, program: str) -> reward_pb2.Sample:
    metadata = struct_pb2.Struct()
    metadata.update({"tests": [{"input": "1 2\n", "output": "3"}]})
    return reward_pb2.Sample(id=sample_id, completion=f"```python\n{program}\n```", metadata=metadata)


def test_code_runs_in_namespaces_inside_the_container(sandboxed_reward):
    with grpc.insecure_channel(sandboxed_reward.address) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        [code] = [r for r in stub.ListRewards(reward_pb2.ListRewardsRequest()).rewards if r.name == "code"]
        assert code.available and "namespaces" in code.status, code.status
        samples = [code_sample("good", "a, b = map(int, input().split())\nprint(a + b)")]
        samples += [code_sample(name, program) for name, program in HOSTILE.items()]
        request = reward_pb2.ScoreRequest(samples=samples, rewards=[reward_pb2.RewardSpec(name="code")])
        scores = {s.id: s for s in stub.Score(request, timeout=120).scores}
    assert scores["good"].reward == 1.0
    for name in HOSTILE:
        [component] = scores[name].components
        assert component.value == 0.0 and component.error, name


@pytest.fixture(scope="module")
def slim_reward(images, network: Network) -> Iterator[Running]:
    running = start_service("grpo-services/reward:cpu-slim", "reward", network, [])
    yield running
    running.remove()


def test_slim_image_scores_without_torch_and_serves_no_models(slim_reward):
    container = slim_reward.container
    assert container.exec_run(["python", "-c", "import torch"]).exit_code != 0
    metadata = struct_pb2.Struct()
    metadata.update({"answer": "7"})
    request = reward_pb2.ScoreRequest(
        samples=[reward_pb2.Sample(id="a", completion="so $\\boxed{7}$", metadata=metadata)],
        rewards=[reward_pb2.RewardSpec(name="accuracy"), reward_pb2.RewardSpec(name="format")],
    )
    with grpc.insecure_channel(slim_reward.address) as channel:
        [score] = reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=60).scores
        assert [c.value for c in score.components] == [1.0, 0.0]
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            admin.ListModels(reward_pb2.ListModelsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
