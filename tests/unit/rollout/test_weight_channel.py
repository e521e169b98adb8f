"""The weight channel without gRPC: manifest checks, bucket layout, shared-memory files, finiteness."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import threading

import pytest
import torch

from grpo_runtime.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
)
from rollout_service.core.weight_channel import (
    TENSOR_ALIGN,
    BucketFiles,
    ChannelManifest,
    GroupJoiner,
    SharedMemoryDir,
    WeightChannel,
    check_manifest,
    fill_bucket,
    plan_buckets,
    shares_directory,
    tensors_in_buckets,
)
from rollout_service.engines.torch_group import MAX_WORLD_SIZE, BroadcastGroup, GroupSpec
from rollout_service.types import WeightFormat, WeightTransport
from rollout_service.weights import all_finite
from tests.support.silent_peer import silent_peer
from trainer_service.rollout.weight_transport import free_port

SHAPES = {"a.weight": (4, 8), "b.weight": (3,), "c.weight": (2, 2)}
TENSORS = {
    "a.weight": torch.arange(32, dtype=torch.float32).reshape(4, 8),
    "b.weight": torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
    "c.weight": torch.full((2, 2), 0.5, dtype=torch.float16),
}


def manifest(**changes) -> ChannelManifest:
    plan = plan_buckets(TENSORS, bucket_bytes=1 << 20)
    base = ChannelManifest(1, WeightFormat.STATE_DICT, plan.layouts, plan.bucket_bytes)
    return dataclasses.replace(base, **changes)


def with_tensor(index: int, **changes) -> ChannelManifest:
    layouts = list(manifest().tensors)
    layouts[index] = dataclasses.replace(layouts[index], **changes)
    return manifest(tensors=tuple(layouts))


def test_a_consistent_manifest_passes_and_its_views_hold_the_tensors():
    plan = plan_buckets(TENSORS, bucket_bytes=1 << 20)
    good = manifest()
    check_manifest(good, 1 << 30, SHAPES)
    bucket = torch.zeros(plan.bucket_bytes[0], dtype=torch.uint8)
    fill_bucket(bucket, plan, 0, TENSORS)
    views = tensors_in_buckets(good, [bucket])
    for name, tensor in TENSORS.items():
        assert views[name].dtype == tensor.dtype
        assert torch.equal(views[name], tensor)


def test_plan_packs_in_order_aligned_and_splits_at_the_bucket_size():
    big = {f"t{i}": torch.zeros(1000) for i in range(10)}  # 4000 bytes each
    plan = plan_buckets(big, bucket_bytes=10_000)
    assert [t.bucket for t in plan.layouts] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all(t.offset % TENSOR_ALIGN == 0 for t in plan.layouts)
    assert all(size <= 10_000 for size in plan.bucket_bytes)
    huge = plan_buckets({"x": torch.zeros(10), "y": torch.zeros(5000)}, bucket_bytes=1000)
    assert huge.bucket_bytes == (40, 20_000)  # a tensor larger than a bucket gets its own
    with pytest.raises(ValueError, match="int64"):
        plan_buckets({"i": torch.zeros(2, dtype=torch.int64)})


@pytest.mark.parametrize(
    ("bad", "field", "error"),
    [
        (lambda: with_tensor(1, dtype="int8"), "tensors[1].dtype", InvalidArgument),
        (lambda: with_tensor(1, dtype="float64"), "tensors[1].dtype", InvalidArgument),
        (lambda: with_tensor(0, shape=(8, 4)), "tensors[0].shape", InvalidArgument),
        (lambda: with_tensor(0, shape=(0, 4)), "tensors[0].shape", InvalidArgument),
        (lambda: with_tensor(0, shape=()), "tensors[0].shape", InvalidArgument),
        (lambda: with_tensor(0, nbytes=4), "tensors[0].nbytes", InvalidArgument),
        (lambda: with_tensor(2, offset=1 << 40), "tensors[2].offset", InvalidArgument),
        (
            lambda: with_tensor(2, offset=manifest().tensors[2].offset + 1),
            "tensors[2].offset",
            InvalidArgument,
        ),
        (lambda: with_tensor(1, offset=0), "tensors[1].offset", InvalidArgument),
        (lambda: with_tensor(1, bucket=3), "tensors[1].bucket", InvalidArgument),
        (lambda: with_tensor(1, name="a.weight"), "tensors[1].name", InvalidArgument),
        (lambda: with_tensor(1, name=""), "tensors[1].name", InvalidArgument),
        (lambda: with_tensor(1, name="z.weight"), "tensors[1].name", InvalidArgument),
        (lambda: manifest(tensors=()), "tensors", InvalidArgument),
        (lambda: manifest(bucket_bytes=()), "bucket_bytes", InvalidArgument),
        (lambda: manifest(bucket_bytes=(0,)), "bucket_bytes[0]", InvalidArgument),
        (lambda: manifest(bucket_bytes=(1 << 31,)), "bucket_bytes", ResourceExhausted),
        (lambda: manifest(format=WeightFormat.UNSPECIFIED), "format", InvalidArgument),
    ],
)
def test_an_inconsistent_manifest_is_refused_naming_the_field(bad, field, error):
    with pytest.raises(error) as info:
        check_manifest(bad(), 1 << 30, SHAPES)
    assert info.value.field == field


def test_lora_tensors_are_not_held_to_the_models_shapes_before_the_bytes():
    check_manifest(manifest(format=WeightFormat.LORA_ADAPTER), 1 << 30, {})


def test_shared_memory_files_are_mapped_only_inside_the_directory(tmp_path):
    shm = SharedMemoryDir.open(tmp_path / "shm")
    assert shares_directory(shm.directory, shm.token)
    assert not shares_directory(shm.directory, "0" * 32)
    assert not shares_directory(shm.directory, "../x")
    files = BucketFiles(shm.directory)
    plan = plan_buckets(TENSORS)
    names = files.write(TENSORS, plan)
    good = manifest(bucket_files=names)
    (bucket,) = shm.map_buckets(good)
    assert torch.equal(tensors_in_buckets(good, [bucket])["a.weight"], TENSORS["a.weight"])
    # The same file again is the same mapping; the sender's next write shows through it.
    changed = {**TENSORS, "a.weight": TENSORS["a.weight"] + 1}
    assert files.write(changed, plan) == names
    (again,) = shm.map_buckets(good)
    assert again.data_ptr() == bucket.data_ptr()
    assert torch.equal(tensors_in_buckets(good, [again])["a.weight"], changed["a.weight"])
    os.symlink(shm.directory / names[0], shm.directory / "link.bucket")
    (tmp_path / "outside.bucket").write_bytes(b"\0" * plan.bucket_bytes[0])
    for name in (
        "../outside.bucket",
        str(tmp_path / "outside.bucket"),
        ".hidden",
        "link.bucket",
        "none.bucket",
    ):
        with pytest.raises((InvalidArgument, PermissionDenied)) as info:
            shm.map_buckets(manifest(bucket_files=(name,)))
        assert info.value.field == "bucket_files[0]"
    with pytest.raises(InvalidArgument) as info:
        shm.map_buckets(manifest(bucket_files=names, bucket_bytes=(plan.bucket_bytes[0] + 8,)))
    assert info.value.field == "bucket_files[0]"
    with pytest.raises(InvalidArgument) as info:
        shm.map_buckets(manifest(bucket_files=()))
    assert info.value.field == "bucket_files"
    del bucket
    files.close()
    shm.close()
    assert list(shm.directory.iterdir()) == [shm.directory / "link.bucket"]


def test_a_bucket_file_with_a_second_hard_link_is_refused_naming_it(tmp_path):
    shm = SharedMemoryDir.open(tmp_path / "shm")
    files = BucketFiles(shm.directory)
    try:
        plan = plan_buckets(TENSORS)
        (name,) = files.write(TENSORS, plan)
        # The second name lives outside the directory: the same bytes, reachable from elsewhere.
        os.link(shm.directory / name, tmp_path / "elsewhere.bucket")
        with pytest.raises(InvalidArgument, match="2 hard links") as info:
            shm.map_buckets(manifest(bucket_files=(name,)))
        assert info.value.field == "bucket_files[0]"
        assert name in info.value.message
        os.unlink(tmp_path / "elsewhere.bucket")
        (bucket,) = shm.map_buckets(manifest(bucket_files=(name,)))
        assert torch.equal(tensors_in_buckets(manifest(), [bucket])["a.weight"], TENSORS["a.weight"])
        del bucket
    finally:
        files.close()
        shm.close()


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_one_bad_value_anywhere(dtype, bad):
    values = torch.randn(3 * (1 << 20) + 2).to(dtype)
    assert all_finite(values)
    for index in (0, 1 << 20, len(values) - 1):
        spoiled = values.clone()
        spoiled[index] = bad
        assert not all_finite(spoiled.reshape(-1, 7)), index
    assert all_finite(torch.tensor([torch.finfo(dtype).max, torch.finfo(dtype).min], dtype=dtype))
