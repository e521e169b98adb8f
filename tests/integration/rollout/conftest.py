"""Clients of the module's ``server`` fixture (each test module starts its own rollout server)."""

from __future__ import annotations

import grpc
import pytest
from grpo.rollout.v1 import rollout_pb2_grpc

from rollout_service.client import RolloutClient


@pytest.fixture(scope="module")
def client(server):
    with RolloutClient(server.address, timeout_s=60) as c:
        c.wait_ready(10)
        yield c


@pytest.fixture(scope="module")
def stub(server):
    """The generated stub, for messages the RolloutClient would never send."""
    with grpc.insecure_channel(server.address) as channel:
        yield rollout_pb2_grpc.RolloutServiceStub(channel)
