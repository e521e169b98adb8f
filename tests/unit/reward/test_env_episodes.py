"""The episode registry without gRPC: isolation, the tool-call pipeline (bad calls are error results),
timeouts, caps, limits and idle expiry, with the calculator and TRL classes as real environments."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from grpo_runtime.env_types import ToolCall
from grpo_runtime.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from reward_service.environments.catalog import build_environments
from reward_service.environments.episodes import TRUNCATION_MARK, EpisodeRegistry, cap
from reward_service.environments.settings import EnvironmentSettings

TRL = {"counter": "tests.support.trl_envs:Counter", "misbehaving": "tests.support.trl_envs:Misbehaving"}


def registry(**overrides) -> EpisodeRegistry:
    settings = EnvironmentSettings.model_validate({"trl": TRL, "python": {"enabled": False}, **overrides})
    threads = ThreadPoolExecutor(4)
    return EpisodeRegistry(build_environments(settings, None, "no sandbox in these tests", threads), settings)


def calc(expression: str, call_id: str = "c") -> ToolCall:
    return ToolCall("calculator", json.dumps({"expression": expression}), call_id)


async def test_calculator_episode_and_the_chat_template_form():
    episodes = registry()
    episode = await episodes.open("calculator", {}, {"answer": "579"})
    assert [t["function"]["name"] for t in episode.chat_template_tools()] == ["calculator"]
    assert episode.chat_template_tools()[0]["function"]["parameters"]["required"] == ["expression"]
    outcome = await episodes.step(episode.episode_id, [calc("123 + 456", "a"), calc("2 ** 10", "b")])
    assert [(r.call_id, r.content, r.error) for r in outcome.results] == [
        ("a", "579", False),
        ("b", "1024", False),
    ]
    assert not outcome.done
    assert (await episodes.reward(episode.episode_id)).value is None
    assert await episodes.close(episode.episode_id)
    assert not await episodes.close(episode.episode_id)  # idempotent


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (ToolCall("calculator", '{"expression": "1+1"'), "not valid JSON"),
        (ToolCall("calculator", "expression=1+1"), "not valid JSON"),
        (ToolCall("calculator", '["1+1"]'), "must be a JSON object, got list"),
        (ToolCall("calculator", '{"expression": 12}'), "12 is not of type 'string'"),
        (ToolCall("calculator", "{}"), "'expression' is a required property"),
        (ToolCall("calculator", "[" * 100_000), "at most"),
        (ToolCall("calculator", "[" * 60_000 + "]" * 60_000), "at most"),
        (ToolCall("calculator", '{"expression": ' + "[" * 5000 + "]" * 5000 + "}"), "not valid JSON"),
        (ToolCall("calculator", '{"expression": ' + "[" * 50 + "]" * 50 + "}"), "is not of type 'string'"),
        (
            ToolCall("calculater", '{"expression": "1"}'),
            "unknown tool 'calculater'; the tools are: calculator",
        ),
        (ToolCall("", "{}"), "unknown tool ''"),
        (ToolCall("calculator", '{"expression": "__import__(\'os\')"}'), "not allowed"),
    ],
)
async def test_bad_calls_are_error_results_and_the_episode_goes_on(call, message):
    episodes = registry()
    episode = await episodes.open("calculator", {}, {})
    outcome = await episodes.step(episode.episode_id, [call, calc("6 * 7")])
    bad, good = outcome.results
    assert bad.error and message in bad.content, bad.content
    assert bad.name == call.name
    assert (good.content, good.error) == ("42", False)
    assert not outcome.done


async def test_empty_arguments_mean_no_arguments():
    episodes = registry()
    episode = await episodes.open("counter", {}, {"target": 2})
    (result,) = (await episodes.step(episode.episode_id, [ToolCall("peek", "")])).results
    assert (result.content, result.error) == ("0", False)


async def test_caller_errors_name_the_field():
    episodes = registry(max_calls_per_step=2)
    with pytest.raises(InvalidArgument, match="unknown environment 'nope'") as info:
        await episodes.open("nope", {}, {})
    assert info.value.field == "environment"
    with pytest.raises(InvalidArgument) as info:
        await episodes.open("", {}, {})
    assert info.value.field == "environment"
    with pytest.raises(InvalidArgument) as info:
        await episodes.open("python", {}, {})  # disabled above: not offered at all
    with pytest.raises(InvalidArgument) as info:
        await episodes.open("calculator", {"precision": 3}, {})
    assert info.value.field == "params.precision"
    with pytest.raises(NotFound) as info:
        await episodes.step("no-such-episode", [calc("1")])
    assert info.value.field == "episode_id"
    with pytest.raises(NotFound):
        await episodes.reward("no-such-episode")
    episode = await episodes.open("calculator", {}, {})
    with pytest.raises(InvalidArgument) as info:
        await episodes.step(episode.episode_id, [])
    assert info.value.field == "calls"
    with pytest.raises(ResourceExhausted) as info:
        await episodes.step(episode.episode_id, [calc("1")] * 3)
    assert info.value.field == "calls" and info.value.retry_after_s is None


async def test_oversized_metadata_is_refused():
    episodes = registry(max_metadata_chars=1000)
    with pytest.raises(InvalidArgument) as info:
        await episodes.open("calculator", {}, {"answer": "x" * 2000})
    assert info.value.field == "metadata"


async def test_open_episode_bound_is_transient_resource_exhausted():
    episodes = registry(max_open_episodes=2)
    first = await episodes.open("calculator", {}, {})
    await episodes.open("counter", {}, {})
    with pytest.raises(ResourceExhausted, match="max_open_episodes") as info:
        await episodes.open("calculator", {}, {})
    assert info.value.retry_after_s is not None  # goes away when episodes close: worth a retry
    await episodes.close(first.episode_id)
    await episodes.open("calculator", {}, {})
    assert episodes.open_count == 2


async def test_trl_episodes_are_isolated_and_rewarded():
    episodes = registry()
    a = await episodes.open("counter", {}, {"target": 2, "prompt": "ignored column"})
    b = await episodes.open("counter", {}, {"target": 5})
    assert a.prompt_suffix == "\nReach exactly 2."
    assert [t.name for t in a.tools] == ["increment", "peek"]
    await episodes.step(
        a.episode_id, [ToolCall("increment", '{"by": 1}'), ToolCall("increment", '{"by": 1}')]
    )
    await episodes.step(b.episode_id, [ToolCall("increment", '{"by": 4}')])
    assert (await episodes.reward(a.episode_id)).value == 1.0
    assert (await episodes.reward(b.episode_id)).value == 0.0
    (peek,) = (await episodes.step(b.episode_id, [ToolCall("peek", "{}")])).results
    assert peek.content == "4"
    # `_private`, `reset` and `get_reward` are not tools, as in TRL.
    (private,) = (await episodes.step(a.episode_id, [ToolCall("_private", "{}")])).results
    assert private.error and "unknown tool" in private.content
    (reset,) = (await episodes.step(a.episode_id, [ToolCall("reset", "{}")])).results
    assert reset.error and "unknown tool" in reset.content


async def test_a_raising_tool_is_an_error_result():
    episodes = registry()
    episode = await episodes.open("misbehaving", {}, {})
    assert episode.prompt_suffix == ""
    (result,) = (await episodes.step(episode.episode_id, [ToolCall("fail", '{"message": "boom"}')])).results
    assert result.error and "ValueError: boom" in result.content
    reward = await episodes.reward(episode.episode_id)
    assert reward.value is None and "not a finite number" in reward.error


@pytest.mark.parametrize("tool", ["hang", "hang_async"])
async def test_a_hanging_tool_times_out_and_ends_the_episode(tool):
    episodes = registry(tool_timeout_s=0.3)
    episode = await episodes.open("misbehaving", {}, {})
    other = await episodes.open("calculator", {}, {})
    start = time.monotonic()
    hung = asyncio.ensure_future(
        episodes.step(
            episode.episode_id, [ToolCall(tool, '{"seconds": 3}'), ToolCall("fail", '{"message": "x"}')]
        )
    )
    # Another episode is served while the tool hangs.
    assert (await episodes.step(other.episode_id, [calc("1 + 1")])).results[0].content == "2"
    outcome = await hung
    assert time.monotonic() - start < 2.5
    timed_out, after = outcome.results
    assert timed_out.error and "did not finish within 0.3s" in timed_out.content
    assert after.error and "the episode has ended" in after.content
    assert outcome.done
    assert await episodes.close(episode.episode_id)


async def test_a_step_cancelled_mid_call_ends_the_episode():
    episodes = registry(tool_timeout_s=30)
    episode = await episodes.open("misbehaving", {}, {})
    hang = ToolCall("hang_async", '{"seconds": 30}')
    step = asyncio.ensure_future(episodes.step(episode.episode_id, [hang]))
    await asyncio.sleep(0.1)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    outcome = await episodes.step(episode.episode_id, [ToolCall("flood", '{"chars": 3}')])
    assert outcome.done and "cancelled" in outcome.results[0].content and outcome.results[0].error
    assert await episodes.close(episode.episode_id)


async def test_flooding_output_is_capped():
    episodes = registry(max_result_chars=1000)
    episode = await episodes.open("misbehaving", {}, {})
    (result,) = (await episodes.step(episode.episode_id, [ToolCall("flood", '{"chars": 5000000}')])).results
    assert result.truncated and not result.error
    assert len(result.content) == 1000 and result.content.endswith(TRUNCATION_MARK)
    assert cap("short", 1000) == ("short", False)


async def test_idle_episodes_expire():
    episodes = registry(idle_timeout_s=1.0)
    idle = await episodes.open("calculator", {}, {})
    await asyncio.sleep(1.2)
    busy = await episodes.open("calculator", {}, {})
    assert await episodes.expire_idle() == 1
    with pytest.raises(NotFound):
        await episodes.step(idle.episode_id, [calc("1")])
    assert (await episodes.step(busy.episode_id, [calc("1")])).results[0].content == "1"


async def test_sweeper_closes_idle_episodes_and_close_all_ends_everything():
    episodes = registry(idle_timeout_s=0.2)
    episodes.start()
    episode = await episodes.open("calculator", {}, {})
    for _ in range(100):
        if episodes.open_count == 0:
            break
        await asyncio.sleep(0.05)
    assert episodes.open_count == 0
    with pytest.raises(NotFound):
        await episodes.reward(episode.episode_id)
    await episodes.open("counter", {}, {})
    await episodes.close_all()
    assert episodes.open_count == 0


async def test_reset_failure_and_slow_open_are_failed_precondition():
    episodes = registry(open_timeout_s=5)
    with pytest.raises(FailedPrecondition, match="could not open an episode: ValueError"):
        await episodes.open("counter", {}, {"target": "not a number"})
    assert episodes.open_count == 0


async def test_one_episode_steps_one_call_at_a_time():
    episodes = registry()
    episode = await episodes.open("counter", {}, {"target": 40})
    steps = [episodes.step(episode.episode_id, [ToolCall("increment", '{"by": 1}')]) for _ in range(40)]
    contents = sorted(int(o.results[0].content.split("=")[1]) for o in await asyncio.gather(*steps))
    assert contents == list(range(1, 41))
    assert (await episodes.reward(episode.episode_id)).value == 1.0


class HugeReward:
    """A TRL class whose reward is an int past float range (str() of it raises in Python 3.11+)."""

    def reset(self, **columns) -> None:
        return None

    def noop(self) -> str:
        """Does nothing."""
        return ""

    def get_reward(self) -> int:
        return 10**5000


async def test_a_reward_past_float_range_is_an_error_not_a_crash():
    episodes = registry(trl={**TRL, "huge": f"{__name__}:HugeReward"})
    episode = await episodes.open("huge", {}, {})
    reward = await episodes.reward(episode.episode_id)
    assert (
        reward.value is None
        and reward.error == "get_reward returned a value of type int, not a finite number"
    )


async def test_count_and_name_checks_need_no_contents():
    """check_open and check_step are what the servicer runs on the wire form before converting it: they
    take names and counts only, and refuse in the same order open and step do."""
    episodes = registry(max_calls_per_step=2, max_open_episodes=1)
    with pytest.raises(InvalidArgument) as info:
        episodes.check_open("nope", {})
    assert info.value.field == "environment"
    with pytest.raises(InvalidArgument) as info:
        episodes.check_open("calculator", ["p" * 10_000])  # the names of a request's params map
    assert info.value.field == "params." + "p" * 100
    episodes.check_open("calculator", [])
    episode = await episodes.open("calculator", {}, {})
    with pytest.raises(ResourceExhausted, match="max_open_episodes"):
        episodes.check_open("calculator", [])
    with pytest.raises(NotFound):
        episodes.check_step("no-such-episode", 3)  # the episode first, then the count
    with pytest.raises(ResourceExhausted, match="max_calls_per_step=2"):
        episodes.check_step(episode.episode_id, 3)
    with pytest.raises(InvalidArgument):
        episodes.check_step(episode.episode_id, 0)
    episodes.check_step(episode.episode_id, 2)


async def test_arguments_are_measured_as_sent_and_long_ones_still_work():
    episodes = registry(max_arguments_chars=10_000)
    episode = await episodes.open("calculator", {}, {})
    padded = ToolCall("calculator", " " * 10_000 + '{"expression": "1 + 1"}')
    long = ToolCall("calculator", json.dumps({"expression": "1 + 1", "note": "x" * 9000}))
    results = (await episodes.step(episode.episode_id, [padded, long])).results
    assert results[0].error and "10023 characters, at most 10000" in results[0].content
    assert (results[1].content, results[1].error) == ("2", False)  # parsed on a worker thread
