"""A calculator agent written with the OpenAI Agents SDK (``openai-agents``): an ``Agent`` with one
``function_tool``, run by ``Runner.run``, served over ``grpo.agent.v1`` so the trainer can train the policy
it calls. Only the base URL ties it to the trainer.

The model is the SDK's default, ``OpenAIResponsesModel`` (the Responses API, which the gateway serves over its
chat path), or with ``api="chat_completions"`` ``OpenAIChatCompletionsModel``; both are given the episode's
client, as ``set_default_openai_client`` would give them a global one. Tracing is disabled: its exporter
would send every run to api.openai.com.

    python -m examples.agents.agents_sdk_agent --port 50060     # from the repository root
"""

from __future__ import annotations

from typing import Any, Literal

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from examples.agents.calculator_task import (
    CALCULATOR_DESCRIPTION,
    Sampling,
    calculator,
    question_messages,
    reward,
    serve,
)
from examples.agents.openai_client import shared_client
from grpo_runtime.agent_server import RunEpisode

set_tracing_disabled(True)


@function_tool(name_override="calculator", description_override=CALCULATOR_DESCRIPTION)
def calculator_tool(expression: str) -> str:
    """Evaluates an arithmetic expression.

    Args:
        expression: numbers, + - * / and parentheses, for example 347 + 582.
    """
    return calculator(expression)


def episode_player(
    sampling: Sampling,
    api: Literal["responses", "chat_completions"] = "responses",
    chain_responses: bool = False,
) -> RunEpisode:
    """``run_episode(task, base_url, deadline)``: the agent answers the row's question within
    ``sampling.max_turns`` model calls, over ``api`` (the names of the SDK's ``set_default_openai_api``). A
    model that calls no known tool or never stops scores 0. ``chain_responses``: each call after the first
    sends only its new items and the previous response's id (the SDK's ``auto_previous_response_id``,
    Responses API only)."""

    shared = shared_client()
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel

    async def run_episode(task: dict[str, Any], base_url: str, deadline: float | None):
        client = shared.with_options(base_url=base_url)
        agent = Agent(
            name="calculator agent",
            # None: the shipped tools policy learned the task without a system message, and under one it
            # does not call the calculator.
            instructions=None,
            tools=[calculator_tool],
            model=model_class(model=sampling.model, openai_client=client),
            model_settings=ModelSettings(temperature=sampling.temperature, max_tokens=sampling.max_tokens),
        )
        try:
            result = await Runner.run(
                agent,
                question_messages(task),
                max_turns=sampling.max_turns,
                auto_previous_response_id=chain_responses,
            )
        except (MaxTurnsExceeded, ModelBehaviorError) as error:  # the policy's doing: a bad episode
            return (0.0 if task.get("answer") else None), {"error": f"{type(error).__name__}: {error}"}
        answer = str(result.final_output or "")
        return reward(answer, task), {"answer": answer, "model_calls": len(result.raw_responses)}

    return run_episode


def main() -> None:
    serve(episode_player, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
