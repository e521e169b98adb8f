"""A server whose start fails (a companion cannot bind) stops what it started and still runs on_shutdown."""

from __future__ import annotations

import pytest
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import BindError, GrpcServer, ServiceBinding
from reward_service.api.reward import RewardServicer
from reward_service.core.scorer import Scorer
from reward_service.core.stress import StressLimits


class Unbindable:
    async def start(self, config: ServerConfig) -> None:
        raise BindError("cannot bind the companion")

    async def stop(self) -> None:
        raise AssertionError("a companion that never started is not stopped")


async def test_failed_start_releases_the_service():
    scorer = Scorer({}, None, max_concurrent=1)
    binding = ServiceBinding(
        servicer=RewardServicer(scorer, 1, StressLimits()),
        add_to_server=reward_pb2_grpc.add_RewardServiceServicer_to_server,
        descriptor=reward_pb2.DESCRIPTOR.services_by_name["RewardService"],
        companions=(Unbindable(),),
    )
    released = []
    config = ServerConfig(host="127.0.0.1", port=0)
    server = GrpcServer(config, [binding], on_shutdown=lambda: released.append(1))
    with pytest.raises(BindError, match="companion"):
        async with server:
            pass
    assert released == [1]
