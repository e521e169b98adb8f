"""The trio brought up from docker/compose.yaml with Debian's docker-compose 1.29: health-gated start, a short
GRPO run through the trainer, and the reward container's code sandbox keeping the admin token secret away from
model-written code.

The compose file is used as shipped, through the variables it reads: the admin token secret is a file made
in a temporary directory (`GRPO_ADMIN_TOKEN_FILE`, never committed), ports are published on 127.0.0.1 on
free ports (`GRPO_*_PORT=0`), and the project has a name of its own, so a trio a developer runs is left alone.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
import yaml
from google.protobuf import struct_pb2
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.healthcheck import check
from tests.containers.service_containers import PORTS, REPO

COMPOSE_DIR = REPO / "docker"
SERVICES = ("reward", "rollout", "trainer")
RUNS_IN_CONTAINER = "/var/lib/grpo/runs"
UP_TIMEOUT_S = 300

# Reads the secret directly and through the service's /proc (environment, root), lists what the service's
# container holds, then answers the test's sum only when it found nothing: a 1.0 proves both that the program
# ran and that the sandbox showed it none of it. (A /proc of the sandbox's own, where the kernel allows one,
# shows the sandbox's init as pid 1: an empty environment and the sandbox's root.)
SNOOPER = """\
import os
a, b = map(int, input().split())
found = []
for secret in ("/run/secrets/admin_token", "/proc/1/environ", "/proc/1/root/run/secrets/admin_token"):
    try:
        found += [secret] if open(secret).read() else []
    except OSError:
        pass
for directory in ("/run", "/run/secrets", "/etc", "/opt/grpo", "/opt/venv", "/var/lib/grpo"):
    try:
        found += [f"{directory}/{name}" for name in os.listdir(directory)]
    except OSError:
        pass
print(a + b if not found else found)
"""


@dataclass
class Trio:
    """A compose project: its name, the command line that addresses it, and the admin token it was given."""

    project: str
    compose: list[str]
    env: dict[str, str]
    token: str

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.compose, *args],
            cwd=COMPOSE_DIR,  # 1.29 resolves the seccomp profile's path against the working directory
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def address(self, service: str) -> str:
        published = self.run("port", service, str(PORTS[service])).stdout.strip()  # "127.0.0.1:49153"
        host, port = published.rsplit(":", 1)
        assert host == "127.0.0.1", published
        return f"127.0.0.1:{port}"

    def health(self, service: str) -> str:
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{json .State}}", self.container(service)],
            capture_output=True,
            text=True,
            check=True,
        )
        state = json.loads(state.stdout)
        return state["Health"]["Status"] if state.get("Health") else state["Status"]

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "60").stdout


@pytest.fixture(scope="module")
def trio(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    if shutil.which("docker-compose") is None:
        missing = "docker-compose is not installed (apt-get install docker-compose)"
        if os.environ.get("REQUIRE_DOCKER") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    secrets_dir = tmp_path_factory.mktemp("compose-secrets")
    secrets_dir.chmod(0o700)  # the token is private to the host user; the bind mount gives it to the services
    token = secrets.token_hex(32)
    token_file = secrets_dir / "admin_token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o644)  # read by the containers' uid 10001 through the bind mount

    project = f"grpo-test-{uuid.uuid4().hex[:8]}"
    compose = ["docker-compose", "-p", project, "-f", "compose.yaml"]
    env = {
        **os.environ,
        "GRPO_ADMIN_TOKEN_FILE": str(token_file),
        "GRPO_REWARD_PORT": "0",
        "GRPO_TRAINER_PORT": "0",
    }
    started = Trio(project, compose, env, token)
    try:
        up = started.run("up", "-d", timeout=UP_TIMEOUT_S)
        assert up.returncode == 0, f"compose up failed:\n{up.stderr}\n{started.logs()}"
        wait_healthy(started)
        yield started
    finally:
        down = started.run("down", "-v", "--remove-orphans", "-t", "5", timeout=180)
        assert down.returncode == 0, down.stderr


def wait_healthy(trio: Trio, services: tuple[str, ...] = SERVICES) -> None:
    """Every service healthy by its compose healthcheck (the trainer starts once reward and rollout are)."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {service: trio.health(service) for service in services}
        if all(state == "healthy" for state in states.values()):
            return
        assert not {"unhealthy", "exited", "dead"} & set(states.values()), f"{states}\n{trio.logs()}"
        time.sleep(2.0)
    raise AssertionError(f"not healthy after {UP_TIMEOUT_S} s: {states}\n{trio.logs()}")


def test_all_three_are_healthy_and_published_on_loopback(trio: Trio) -> None:
    assert {service: trio.health(service) for service in SERVICES} == dict.fromkeys(SERVICES, "healthy")
    for service in ("reward", "trainer"):
        assert check(trio.address(service), f"grpo.{service}.v1.{service.capitalize()}Service", timeout_s=5)
    assert trio.run("port", "rollout", str(PORTS["rollout"])).stdout.strip() in ("", ":0")  # not published


def test_short_training_run_through_the_trainer(trio: Trio) -> None:
    config = yaml.safe_dump(
        {
            "base": "/opt/grpo/models/demo",
            "output": f"{RUNS_IN_CONTAINER}/compose-smoke",
            "data": {"train": "/opt/grpo/data/demo/train.jsonl"},
            "training": {
                "max_steps": 2,
                "seed": 0,
                "optimizer": {"per_device_train_batch_size": 8, "learning_rate": 1e-3},
                "generation": {"num_generations": 4, "max_completion_length": 8},
                "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
                "model": {"lora": {"r": 8, "alpha": 16}},
            },
            # Service names on the compose network; the trainer sends the token from its own secret mount.
            "services": {
                "reward": "reward:50051",
                "rollout": "rollout:50052",
                "admin_token_file": "/run/secrets/admin_token",
                "retry_timeout_s": 120,
            },
        }
    )
    auth = (("authorization", f"Bearer {trio.token}"),)
    with grpc.insecure_channel(trio.address("trainer")) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config), timeout=60)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # the secret is in force
        request = trainer_pb2.StartRunRequest(config_yaml=config)
        run_id = stub.StartRun(request, metadata=auth, timeout=120).run_id
        events = list(stub.WatchRun(trainer_pb2.WatchRunRequest(run_id=run_id), timeout=600))
    assert events[-1].state == trainer_pb2.RUN_STATE_COMPLETED, f"{events[-1].message}\n{trio.logs()}"
    assert {event.step for event in events if event.step} == {1, 2}
    listing = trio.run("exec", "-T", "trainer", "ls", f"{RUNS_IN_CONTAINER}/compose-smoke")
    assert "adapter_model.safetensors" in listing.stdout.split(), listing.stdout + listing.stderr


def test_sandboxed_code_sees_no_secret_and_none_of_the_container(trio: Trio) -> None:
    metadata = struct_pb2.Struct()
    metadata.update({"tests": [{"input": "1 2\n", "output": "3"}]})
    sample = reward_pb2.Sample(id="snoop", completion=f"```python\n{SNOOPER}```", metadata=metadata)
    request = reward_pb2.ScoreRequest(samples=[sample], rewards=[reward_pb2.RewardSpec(name="code")])
    with grpc.insecure_channel(trio.address("reward")) as channel:  # no token: any caller may Score
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        rewards = stub.ListRewards(reward_pb2.ListRewardsRequest(), timeout=30).rewards
        [code] = [reward for reward in rewards if reward.name == "code"]
        assert code.available, code.status
        response = stub.Score(request, timeout=120)
    [score] = response.scores
    [component] = score.components
    assert trio.token not in str(response)
    assert component.value == 1.0, f"the sandbox showed the program: {component.error or score}"
    # The service itself does hold the secret: the sandbox, not a missing file, kept it away.
    in_container = trio.run("exec", "-T", "reward", "cat", "/run/secrets/admin_token")
    assert in_container.stdout.strip() == trio.token
