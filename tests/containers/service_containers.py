"""Service containers for the container tests: the images' production settings, started with testcontainers.

Containers are reached only through ports published on 127.0.0.1 and talk to each other on a Docker
network the test creates.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Before testcontainers is imported: no reaper image to pull, only loopback addresses.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
os.environ.setdefault("TC_HOST", "127.0.0.1")

from docker.models.containers import Container
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from grpo_runtime.healthcheck import check

REPO = Path(__file__).resolve().parents[2]
PORTS = {"reward": 50051, "rollout": 50052, "trainer": 50053}
CONTAINER_UID = "10001"


def docker_running() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@dataclass
class Running:
    """A started service container (docker SDK object) and the loopback address its port is published on."""

    container: Container
    name: str

    @property
    def address(self) -> str:
        self.container.reload()  # the published port changes when the container is restarted
        [binding] = self.container.ports[f"{PORTS[self.name]}/tcp"]
        return f"127.0.0.1:{binding['HostPort']}"

    def logs(self) -> str:
        return self.container.logs().decode(errors="replace")

    def remove(self) -> None:
        self.container.remove(force=True)


def hardened(container: DockerContainer) -> DockerContainer:
    """The production settings: non-root, read-only root filesystem, writable /tmp only."""
    return container.with_tmpfs_mount("/tmp").with_kwargs(
        user=f"{CONTAINER_UID}:{CONTAINER_UID}",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true"],
        shm_size="1g",
    )


def launch_service(
    image: str,
    name: str,
    network: Network,
    args: list[str],
    volumes: Sequence[tuple[str, str, str]] = (),
) -> Running:
    """Start one service container on ``network`` (alias = ``name``); not yet waited for, so that several
    containers load their models and imports at the same time (:func:`wait_all_serving`)."""
    port = PORTS[name]
    container = hardened(
        DockerContainer(image)
        .with_command(["--host", "0.0.0.0", "--port", str(port), *args])
        .with_network(network)
        .with_network_aliases(name)
    )
    # Published on 127.0.0.1 only, on a free host port (with_exposed_ports would publish on every interface).
    container.ports[f"{port}/tcp"] = ("127.0.0.1", None)
    for host_path, container_path, mode in volumes:
        container = container.with_volume_mapping(host_path, container_path, mode)
    container.start()
    return Running(container.get_wrapped_container(), name)


def start_service(
    image: str,
    name: str,
    network: Network,
    args: list[str],
    volumes: Sequence[tuple[str, str, str]] = (),
) -> Running:
    """Start one service container on ``network`` (alias = ``name``) and wait until it is SERVING."""
    running = launch_service(image, name, network, args, volumes)
    wait_serving(running)
    return running


def wait_all_serving(started: Iterable[Running]) -> None:
    """Wait for each of the started containers in turn; they start concurrently meanwhile."""
    for running in started:
        wait_serving(running)


def wait_serving(running: Running, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running.container.reload()
        if running.container.status in ("exited", "dead"):
            raise AssertionError(f"{running.name} container exited:\n{running.logs()[-4000:]}")
        if check(running.address, timeout_s=2.0):
            return
        time.sleep(1.0)
    raise AssertionError(f"{running.name} not SERVING after {timeout_s} s:\n{running.logs()[-4000:]}")
