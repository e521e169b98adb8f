"""Fixtures for container tests: images built by docker/build_images.sh, started with testcontainers.

With REQUIRE_DOCKER=1 (as CI sets) a missing Docker daemon fails these tests instead of skipping them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

# Imported before testcontainers itself: that module sets testcontainers' environment first.
from tests.containers.service_containers import PORTS, REPO, Network, docker_running


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(item.fspath).is_relative_to(here):
            item.add_marker(pytest.mark.containers)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """Service name → image tag, built (or reused from the layer cache) by docker/build_images.sh."""
    if not docker_running():
        if os.environ.get("REQUIRE_DOCKER") == "1":
            pytest.fail("REQUIRE_DOCKER=1 but no Docker daemon answers `docker info`")
        pytest.skip("no Docker daemon (set REQUIRE_DOCKER=1 to make this a failure)")
    subprocess.run([str(REPO / "docker" / "build_images.sh"), "cpu"], cwd=REPO, check=True)
    return {name: f"grpo-services/{name}:cpu" for name in PORTS}


@pytest.fixture(scope="module")
def network(images: dict[str, str]) -> Iterator[Network]:
    with Network() as net:
        yield net
