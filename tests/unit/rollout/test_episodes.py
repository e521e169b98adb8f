"""The episode loop in RolloutCore, without gRPC: a scripted policy and a real tiny HF one against an
in-process calculator environment."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from grpo_runtime.env_types import ToolResult
from grpo_runtime.errors import InvalidArgument
from rollout_service.core.rollout import RolloutCore
from rollout_service.core.tool_calls import ToolSuffixer
from rollout_service.engines.hf import HFEngine
from rollout_service.settings import EpisodeSettings
from rollout_service.types import (
    EpisodeSpec,
    FinishReason,
    GenerateRequest,
    PromptInput,
    SamplingSpec,
    WeightFormat,
)
from rollout_service.weights import ParamCatalog
from tests.support.episodes import SCRIPTED_LOGPROB, CalculatorEnvironment, ScriptedEngine, tool_call

ANSWER = "56088"


def calculator_script(prompt: str) -> str:
    """Call the calculator on the question's expression; once a result is in, answer with it."""
    results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", prompt, re.DOTALL)
    if results:
        return f"The answer is {results[-1]}."
    return tool_call(re.search(r"What is (.+?)\?", prompt).group(1))


async def make_core(model_dir, engine, env, **settings) -> RolloutCore:
    core = RolloutCore(
        engine,
        engine.tokenizer,
        ParamCatalog.from_model_dir(model_dir),
        batch_window_s=0.01,
        environments={"default": env},
        episode_settings=EpisodeSettings(**settings),
    )
    await core.start()
    return core


def episode_request(n=1, questions=("What is 123 * 456?",), max_tokens=200, episode=None, **sampling):
    episode = episode or EpisodeSpec("calculator", metadata={"answer": ANSWER})
    prompts = tuple(
        PromptInput(id=f"q{i}", messages=(("user", q),), episode=episode) for i, q in enumerate(questions)
    )
    return GenerateRequest(prompts, n, SamplingSpec(max_tokens=max_tokens, **sampling))


@pytest.fixture
async def scripted(tiny_models):
    """build(script, mode, **episode_settings) → (core, env, engine); cores are closed after the test."""
    cores = []

    async def build(script=calculator_script, mode="ok", **settings):
        env = CalculatorEnvironment(mode)
        engine = ScriptedEngine(tiny_models["policy"], script)
        core = await make_core(tiny_models["policy"], engine, env, **settings)
        cores.append(core)
        return core, env, engine

    yield build
    for core in cores:
        await core.close()


async def test_episode_calls_the_tool_then_answers_with_masks_and_spans(scripted):
    core, env, _ = await scripted()
    [c] = await core.generate(episode_request())
    assert c.finish_reason == FinishReason.STOP and not c.error
    assert c.tool_call_count == 1 and c.tool_failure_count == 0
    assert c.env_reward == 1.0 and env.rewards_read == 1
    assert [t.tool_calls for t in c.turns] == [1, 0]
    assert len(c.tool_mask) == len(c.token_ids) == len(c.logprobs)
    first, second = c.turns
    assert first.start == 0 and second.end == len(c.token_ids)
    # The gap between the model's turns is the tool message: mask 0, logprob placeholders 0.
    assert c.tool_mask == [1] * first.end + [0] * (second.start - first.end) + [1] * (
        second.end - second.start
    )
    assert set(c.logprobs[first.end : second.start]) == {0.0}
    assert set(c.logprobs[: first.end] + c.logprobs[second.start :]) == {SCRIPTED_LOGPROB}
    suffix = ToolSuffixer(core.tokenizer).suffix_ids([ToolResult("call_0", "calculator", ANSWER)])
    assert c.token_ids[first.end : second.start] == suffix
    assert "The answer is 56088." in c.text
    assert env.opened == env.closed == 1 and not env.open


async def test_an_episode_that_skips_the_reward_never_reads_it(scripted):
    core, env, _ = await scripted()
    spec = EpisodeSpec("calculator", metadata={"answer": ANSWER}, skip_reward=True)
    [c] = await core.generate(episode_request(episode=spec))
    assert c.finish_reason == FinishReason.STOP and c.tool_call_count == 1
    assert c.env_reward is None and env.rewards_read == 0
    assert env.opened == env.closed == 1


async def test_ids_out_are_the_model_ids_and_tool_ids_exactly(scripted):
    """Token-in/token-out: every turn's prompt is the previous prompt + its ids, never re-tokenized text."""
    seen: list[str] = []

    def recording(prompt: str) -> str:
        seen.append(prompt)
        return calculator_script(prompt)

    core, _, _ = await scripted(recording)
    [c] = await core.generate(episode_request())
    tok = core.tokenizer
    assert tok.decode(c.prompt_token_ids, skip_special_tokens=False) == seen[0]
    second_prompt = tok.decode(
        c.prompt_token_ids + c.token_ids[: c.turns[1].start], skip_special_tokens=False
    )
    assert second_prompt == seen[1]


async def test_episodes_of_a_request_run_concurrently_and_batch_together(scripted):
    core, env, engine = await scripted()
    questions = tuple(f"What is {a} * 7?" for a in range(100, 106))
    out = await core.generate(episode_request(n=2, questions=questions))
    assert [c.prompt_id for c in out] == [f"q{i}" for i in range(6) for _ in range(2)]
    assert all(c.finish_reason == FinishReason.STOP and c.tool_call_count == 1 for c in out)
    for i, c in enumerate(out):
        assert f"The answer is {(100 + i // 2) * 7}." in c.text
    assert engine.turns_generated == 24 and env.closed == 12


async def test_the_samples_of_a_prompt_share_one_render_with_the_tools(scripted):
    core, _, _ = await scripted()
    runner = core.episodes
    rendered = []

    def counting(prompt, episode, index):
        rendered.append(index)
        return render(prompt, episode, index)

    render, runner._prompt_ids = runner._prompt_ids, counting
    out = await core.generate(episode_request(n=4, questions=("What is 1 * 7?", "What is 2 * 7?")))
    assert sorted(rendered) == [0, 1]
    assert [c.prompt_token_ids for c in out[:4]] == [out[0].prompt_token_ids] * 4
    assert out[0].prompt_token_ids != out[4].prompt_token_ids
    assert all(c.finish_reason == FinishReason.STOP and c.tool_call_count == 1 for c in out)


async def test_max_turns_and_max_tool_calls_stop_a_model_that_keeps_calling(scripted):
    core, env, _ = await scripted(lambda prompt: tool_call("1 + 1"))
    [c] = await core.generate(episode_request(max_tokens=450, episode=EpisodeSpec("calculator", max_turns=3)))
    assert c.finish_reason == FinishReason.TURN_LIMIT
    assert len(c.turns) == 3 and c.tool_call_count == 2
    [c] = await core.generate(
        episode_request(max_tokens=450, episode=EpisodeSpec("calculator", max_tool_calls=1))
    )
    assert c.finish_reason == FinishReason.TURN_LIMIT and c.tool_call_count == 1 and len(c.turns) == 2
    assert env.opened == env.closed == 2


async def test_token_budget_bounds_model_and_tool_tokens_together(scripted):
    core, _, _ = await scripted(lambda prompt: tool_call("1 + 1"))
    [c] = await core.generate(episode_request(max_tokens=70))
    assert c.finish_reason == FinishReason.LENGTH
    assert len(c.token_ids) <= 70
    assert c.turns[-1].end == len(c.token_ids)  # results that would not fit are dropped, as TRL does


async def test_malformed_and_unknown_calls_are_error_results_the_model_sees(scripted):
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 +"\n</tool_call>'
    unknown = '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'

    def script(prompt: str) -> str:
        return "done" if "<|im_start|>tool" in prompt else bad + unknown

    core, env, _ = await scripted(script)
    [c] = await core.generate(episode_request(max_tokens=450))
    assert c.finish_reason == FinishReason.STOP
    assert c.tool_call_count == 2 and c.tool_failure_count == 2
    tool_text = core.tokenizer.decode(c.token_ids[c.turns[0].end : c.turns[1].start])
    assert "not valid JSON" in tool_text and "unknown tool 'search'" in tool_text
    assert [call.name for call in env.steps[0]] == ["search"]  # the malformed one never left the service


async def test_a_hung_step_ends_that_episode_with_the_reason(scripted):
    core, env, _ = await scripted(mode="hang", step_timeout_s=0.3)
    out = await asyncio.wait_for(core.generate(episode_request(n=2)), 60)
    assert all(c.finish_reason == FinishReason.ERROR for c in out)
    assert all("Step timed out after 0.3 s" in c.error for c in out)
    assert all(c.turns and c.tool_mask == [1] * len(c.token_ids) for c in out)  # tokens so far are kept
    assert all(c.tool_call_count == c.tool_failure_count == 1 for c in out)  # the call made, and failed
    assert env.closed == 2


async def test_a_dead_environment_is_a_per_completion_error(scripted):
    core, _, _ = await scripted(mode="die")
    [c] = await core.generate(episode_request())
    assert c.finish_reason == FinishReason.ERROR and "went away" in c.error
    assert c.env_reward is None and c.tool_call_count == c.tool_failure_count == 1


async def test_tool_result_tokens_carry_the_version_of_the_turn_before_them(scripted):
    """Weights change while the environment runs the tool: the first turn and the tool's result are of the
    old version, the answer of the new one; the completion's version is the oldest."""
    core, env, _ = await scripted()
    core.versions.advance(4, WeightFormat.STATE_DICT)
    step = env.step

    async def step_during_an_update(episode_id, calls):
        outcome = await step(episode_id, calls)
        core.versions.advance(5, WeightFormat.STATE_DICT)  # as an update applied meanwhile would
        return outcome

    env.step = step_during_an_update
    request = dataclasses.replace(episode_request(), continue_across_updates=True)
    [c] = await core.generate(request)
    first, second = c.turns
    assert (first.policy_version, second.policy_version) == (4, 5) and c.policy_version == 4
    assert c.token_versions == [4] * second.start + [5] * (second.end - second.start)


async def test_an_episode_waiting_for_a_version_opens_meanwhile_and_samples_with_it(scripted):
    core, env, _ = await scripted()
    request = dataclasses.replace(episode_request(), min_policy_version=1)
    waiting = asyncio.create_task(core.generate(request))
    for _ in range(500):  # the environment answers at once; the episode then waits for the weights
        if env.opened:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert env.opened == 1 and not env.steps and not waiting.done()
    with core.version_waits.update_to(1):  # as an update applying now would
        core.versions.advance(1, WeightFormat.LORA_ADAPTER)
    [c] = await waiting
    assert c.finish_reason == FinishReason.STOP and {t.policy_version for t in c.turns} == {1}


async def test_an_episode_that_cannot_open_has_the_version_served_now(scripted):
    """It has no turn, so no weights wrote it: a version-checking trainer takes it as the error it is."""
    core, _, _ = await scripted()
    core.versions.advance(3, WeightFormat.LORA_ADAPTER)  # as three weight updates would leave it
    [c] = await core.generate(episode_request(episode=EpisodeSpec("no-such-environment")))
    assert c.finish_reason == FinishReason.ERROR and "OpenEpisode" in c.error
    assert c.turns == [] and c.policy_version == 3
    assert "What is 123 * 456?" in core.tokenizer.decode(c.prompt_token_ids)  # the prompt, without tools


async def test_a_flooding_tool_is_cut_and_cannot_overrun_the_budget(scripted):
    core, _, _ = await scripted(mode="flood", max_result_chars=50)
    [c] = await core.generate(episode_request(max_tokens=300))
    tool_ids = c.token_ids[c.turns[0].end : c.turns[1].start]
    assert core.tokenizer.decode(tool_ids).count("9") == 50
    [c] = await core.generate(episode_request(max_tokens=60))
    assert len(c.token_ids) <= 60


async def test_done_environment_stops_further_tool_calls(scripted):
    core, _, _ = await scripted(lambda prompt: tool_call("2 * 3"), mode="done")
    [c] = await core.generate(episode_request())
    assert c.finish_reason == FinishReason.TURN_LIMIT and c.tool_call_count == 1 and len(c.turns) == 2


async def test_cancelling_the_call_closes_every_episode(scripted):
    core, env, _ = await scripted(mode="hang")
    task = asyncio.ensure_future(core.generate(episode_request(n=3)))
    while len(env.steps) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.opened == env.closed == 3


@pytest.mark.parametrize(
    ("episode", "field"),
    [
        (EpisodeSpec("calculator", target="elsewhere"), "prompts[0].episode.target"),
        (EpisodeSpec(""), "prompts[0].episode.environment"),
        (EpisodeSpec("calculator", max_turns=99), "prompts[0].episode.max_turns"),
        (EpisodeSpec("calculator", max_tool_calls=99), "prompts[0].episode.max_tool_calls"),
    ],
)
async def test_bad_episode_requests_name_the_field(scripted, episode, field):
    core, env, _ = await scripted()
    with pytest.raises(InvalidArgument) as info:
        await core.generate(episode_request(episode=episode))
    assert info.value.field == field and env.opened == 0


async def test_an_episode_needs_chat_messages_and_every_prompt_one(scripted):
    core, _, _ = await scripted()
    spec = EpisodeSpec("calculator")
    with pytest.raises(InvalidArgument, match="chat messages"):
        await core.generate(GenerateRequest((PromptInput(text="hi", episode=spec),), 1, SamplingSpec()))
    mixed = (PromptInput(messages=(("user", "a"),), episode=spec), PromptInput(messages=(("user", "b"),)))
    with pytest.raises(InvalidArgument) as info:
        await core.generate(GenerateRequest(mixed, 1, SamplingSpec()))
    assert info.value.field == "prompts[1].episode"


async def test_real_hf_policy_runs_an_episode_token_in_token_out(tiny_models):
    """The random tiny policy rarely writes a tool call; its episode is then one turn whose ids and
    logprobs are what the engine sampled (same seed, same ids as a plain Generate of the same prompt)."""
    engine = HFEngine(str(tiny_models["policy"]))
    env = CalculatorEnvironment()
    core = await make_core(tiny_models["policy"], engine, env)
    try:
        [c] = await core.generate(episode_request(max_tokens=24, temperature=0.0))
        plain = PromptInput(messages=(("user", "What is 123 * 456?"),))
        [p] = await core.generate(GenerateRequest((plain,), 1, SamplingSpec(max_tokens=24, temperature=0.0)))
    finally:
        await core.close()
    assert c.prompt_token_ids == p.prompt_token_ids  # the tiny template ignores tools
    assert c.token_ids[: len(p.token_ids)] == p.token_ids
    assert c.tool_mask[: len(p.token_ids)] == [1] * len(p.token_ids)
    assert c.turns[0].policy_version == 0 and c.policy_version == 0
    assert env.opened == env.closed == 1
