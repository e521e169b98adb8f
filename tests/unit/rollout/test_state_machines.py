"""Versions, the batch/update lock and the sleep state machine."""

from __future__ import annotations

import asyncio

import pytest

from grpo_runtime.errors import FailedPrecondition, InvalidArgument
from rollout_service.core.sleep import SleepState
from rollout_service.core.versioning import MAX_POLICY_VERSION, ReadWriteLock, VersionState
from rollout_service.types import WeightFormat


def test_version_must_increase():
    state = VersionState()
    state.advance(3, WeightFormat.LORA_ADAPTER)
    for stale in (0, 3):
        with pytest.raises(InvalidArgument) as info:
            state.check_next(stale)
        assert info.value.field == "version"
    state.advance(4, WeightFormat.STATE_DICT)
    assert (state.policy_version, state.weight_format) == (4, WeightFormat.STATE_DICT)


def test_versions_stay_inside_int64():
    """The wire's uint64 reaches 2**64 - 1; engines key adapters by an int64."""
    state = VersionState()
    for too_large in (MAX_POLICY_VERSION + 1, 2**64 - 1):
        with pytest.raises(InvalidArgument, match="below 2\\*\\*63") as info:
            state.check_next(too_large)
        assert info.value.field == "version"
    state.advance(MAX_POLICY_VERSION, WeightFormat.STATE_DICT)
    assert state.policy_version == 2**63 - 1


async def test_writer_waits_for_readers_and_blocks_new_ones():
    lock = ReadWriteLock()
    events: list[str] = []
    reader_in = asyncio.Event()
    release_reader = asyncio.Event()

    async def reader(name: str, hold: asyncio.Event | None = None) -> None:
        async with lock.read():
            events.append(f"{name} in")
            if hold is not None:
                reader_in.set()
                await hold.wait()
            events.append(f"{name} out")

    async def writer() -> None:
        async with lock.write():
            events.append("write")

    first = asyncio.create_task(reader("r1", release_reader))
    await reader_in.wait()
    w = asyncio.create_task(writer())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(reader("r2"))
    await asyncio.sleep(0.01)
    assert events == ["r1 in"]  # the writer waits for r1; r2 waits behind the writer
    release_reader.set()
    await asyncio.gather(first, w, late)
    assert events == ["r1 in", "r1 out", "write", "r2 in", "r2 out"]


def test_sleep_levels_and_wake_tags():
    state = SleepState()
    state.check_generate()
    assert state.check_sleep(1)
    state.enter(1)
    with pytest.raises(FailedPrecondition):
        state.check_generate()
    assert not state.check_sleep(1)  # already asleep at that level: no-op
    with pytest.raises(FailedPrecondition):
        state.check_sleep(2)
    state.wake(SleepState.parse_tags([]))
    assert state.level == 0 and state.weights_valid
    state.check_generate()


def test_level_two_invalidates_weights_until_a_push():
    state = SleepState()
    state.enter(2)
    with pytest.raises(FailedPrecondition):
        state.check_weight_update()  # weights asleep
    state.wake({"weights"})
    state.check_weight_update()
    assert state.level == 2 and state.sleeping_tags == {"kv_cache"}
    state.wake({"kv_cache"})
    with pytest.raises(FailedPrecondition, match="level-2"):
        state.check_generate()
    state.weights_loaded()
    state.check_generate()


@pytest.mark.parametrize(("tags", "field"), [(["cpu"], "tags[0]"), (["weights", "x"], "tags[1]")])
def test_unknown_tags_and_levels(tags, field):
    with pytest.raises(InvalidArgument) as info:
        SleepState.parse_tags(tags)
    assert info.value.field == field
    with pytest.raises(InvalidArgument) as info:
        SleepState().check_sleep(3)
    assert info.value.field == "level"
