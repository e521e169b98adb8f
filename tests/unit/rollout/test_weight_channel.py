"""The replica's weight channel without gRPC: what it refuses to open, joining a group within its timeout,
receiving a broadcast."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading

import pytest
import torch

from grpo_runtime.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted
from rollout_service.core.weight_channel import WeightChannel
from rollout_service.types import WeightFormat, WeightTransport
from rollout_service.weight_plane.buckets import fill_bucket, plan_buckets, tensors_in_buckets
from rollout_service.weight_plane.distributed import MAX_WORLD_SIZE, BroadcastGroup, GroupJoiner, GroupSpec
from rollout_service.weight_plane.manifest import ChannelManifest
from tests.support.bucket_layouts import TENSORS
from tests.support.silent_peer import silent_peer
from trainer_service.rollout.weight_transport import free_port


def test_the_channel_refuses_what_it_cannot_serve():
    channel = WeightChannel(None)
    assert channel.supported == (WeightTransport.GRPC_STREAM, WeightTransport.TORCH_DISTRIBUTED)
    with pytest.raises(FailedPrecondition):
        channel.require()
    with pytest.raises(FailedPrecondition):
        channel.check_open(WeightTransport.SHARED_MEMORY, None)
    with pytest.raises(InvalidArgument) as info:
        channel.check_open(WeightTransport.GRPC_STREAM, None)
    assert info.value.field == "transport"
    spec = GroupSpec("tcp://127.0.0.1:1234", 1, 2)
    for changes, field in [
        ({"init_method": "http://127.0.0.1:1"}, "init_method"),
        ({"init_method": "tcp://127.0.0.1"}, "init_method"),
        ({"rank": 0}, "rank"),
        ({"rank": 2}, "rank"),
        ({"init_method": "tcp://127.0.0.1:65536"}, "init_method"),
        ({"init_method": "tcp://127.0.0.1:0"}, "init_method"),
        ({"init_method": "tcp://local\x00host:1"}, "init_method"),
        ({"init_method": f"tcp://{'a' * 254}:1"}, "init_method"),
        ({"rank": 0}, "rank"),
        ({"rank": 2}, "rank"),
        ({"rank": 2**32 - 1}, "rank"),
        ({"world_size": 1, "rank": 0}, "world_size"),
        # torch takes the size as a C int: 2**31 and more would be a TypeError inside the join.
        ({"world_size": MAX_WORLD_SIZE + 1}, "world_size"),
        ({"world_size": 2**31}, "world_size"),
        ({"world_size": 2**32 - 1, "rank": 1}, "world_size"),
        ({"backend": "mpi"}, "backend"),
        ({"timeout_s": 0.0}, "timeout_seconds"),
        ({"timeout_s": -1.0}, "timeout_seconds"),
        ({"timeout_s": math.nan}, "timeout_seconds"),
        ({"timeout_s": math.inf}, "timeout_seconds"),
        ({"timeout_s": 1e308}, "timeout_seconds"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            channel.check_open(WeightTransport.TORCH_DISTRIBUTED, dataclasses.replace(spec, **changes))
        assert info.value.field == field, changes
    channel.check_open(
        WeightTransport.TORCH_DISTRIBUTED, dataclasses.replace(spec, world_size=MAX_WORLD_SIZE)
    )


async def test_a_join_nobody_answers_is_deadline_exceeded_naming_the_timeout():
    channel = WeightChannel(None)
    # Nobody hosts the store at this port: torch retries the connection until past the timeout.
    with pytest.raises(DeadlineExceeded, match="did not form within 1 s") as info:
        await channel.join_group(GroupSpec(f"tcp://127.0.0.1:{free_port('127.0.0.1')}", 1, 2, "gloo", 1.0))
    assert info.value.field == "timeout_seconds"
    assert channel.transport == WeightTransport.GRPC_STREAM
    # torch's retry of the refused connection outlives the timeout; its thread ends when torch gives up.
    await _wait_until(lambda: channel.joiner.abandoned == 0)


async def _wait_until(condition) -> None:
    """Until ``condition()`` holds; only a hang runs into the bound."""
    for _ in range(1200):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition never held")


async def test_a_join_to_a_peer_that_never_answers_is_abandoned_at_its_timeout():
    joiner = GroupJoiner(max_abandoned=1)
    channel = WeightChannel(None, joiner=joiner)
    with silent_peer() as port:
        spec = GroupSpec(f"tcp://127.0.0.1:{port}", 1, 2, "gloo", 1.0)
        # torch's store handshake waits for the peer's answer without a timeout; the joiner does not.
        with pytest.raises(DeadlineExceeded, match="did not form within 1 s") as info:
            await channel.join_group(spec)
        assert info.value.field == "timeout_seconds"
        assert channel.transport == WeightTransport.GRPC_STREAM
        assert joiner.abandoned == 1
        # Its thread still waits: one more join would be a second waiting thread.
        with pytest.raises(ResourceExhausted, match="1 abandoned joins still wait"):
            await channel.join_group(spec)
    # The peer closed its connections: the abandoned thread's receive fails and the thread ends.
    await _wait_until(lambda: joiner.abandoned == 0)
    assert not [t for t in threading.enumerate() if t.name == "weight-group-join"]


async def test_a_join_the_trainer_hosts_forms_and_broadcasts():
    spec = GroupSpec(f"tcp://127.0.0.1:{free_port('127.0.0.1')}", 0, 2, "gloo", 30.0)
    hosted: list[BroadcastGroup] = []
    host = threading.Thread(target=lambda: hosted.append(BroadcastGroup(spec)))
    host.start()
    channel = WeightChannel(None)
    await channel.join_group(dataclasses.replace(spec, rank=1))
    await asyncio.to_thread(host.join)
    try:
        assert channel.transport == WeightTransport.TORCH_DISTRIBUTED
        plan = plan_buckets(TENSORS)
        layout = ChannelManifest(1, WeightFormat.STATE_DICT, plan.layouts, plan.bucket_bytes)
        sent = [torch.empty(size, dtype=torch.uint8) for size in plan.bucket_bytes]
        receiving = asyncio.create_task(asyncio.to_thread(channel.receive, layout))
        await asyncio.to_thread(hosted[0].broadcast, sent, lambda i, b: fill_bucket(b, plan, i, TENSORS))
        received = await receiving
        assert torch.equal(tensors_in_buckets(layout, received)["b.weight"], TENSORS["b.weight"])
    finally:
        hosted[0].close()
        channel.close()
    assert channel.transport == WeightTransport.GRPC_STREAM
