"""A calculator agent written with the official ``openai`` Python SDK and a hand-written tool loop, served
over ``grpo.agent.v1`` so the trainer can train the policy it calls. Only the base URL ties it to the trainer:
the same code runs against any OpenAI-compatible server.

    python -m examples.agents.openai_sdk_agent --port 50060     # from the repository root
"""

from __future__ import annotations

import json
from typing import Any

from examples.agents.calculator_task import (
    CALCULATOR_DESCRIPTION,
    CALCULATOR_PARAMETERS,
    Sampling,
    calculator,
    question_messages,
    reward,
    serve,
)
from examples.agents.openai_client import shared_client
from grpo_runtime.agent_server import RunEpisode

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": CALCULATOR_DESCRIPTION,
        "parameters": CALCULATOR_PARAMETERS,
    },
}


def tool_result(name: str, arguments_json: str) -> str:
    """The tool message's content for one call; a bad call is answered, never raised."""
    if name != "calculator":
        return f"error: unknown tool {name!r}; the tool is calculator"
    try:
        arguments = json.loads(arguments_json or "{}")
    except json.JSONDecodeError as error:
        return f"error: arguments are not JSON: {error.msg}"
    if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
        return 'error: arguments must be {"expression": "..."}'
    return calculator(arguments["expression"])


def episode_player(sampling: Sampling) -> RunEpisode:
    """``run_episode(task, base_url, deadline)``: the model answers the row's question, calling the
    calculator as often as it likes within ``sampling.max_turns`` model calls."""

    shared = shared_client()

    async def run_episode(task: dict[str, Any], base_url: str, deadline: float | None):
        client = shared.with_options(base_url=base_url)
        messages: list[dict[str, Any]] = list(question_messages(task))
        tool_calls = 0
        for _ in range(sampling.max_turns):
            reply = await client.chat.completions.create(
                model=sampling.model,
                messages=messages,
                tools=[CALCULATOR_TOOL],
                temperature=sampling.temperature,
                max_tokens=sampling.max_tokens,
            )
            message = reply.choices[0].message
            # The reply goes back as it came (same text, same calls): the gateway then reuses its tokens.
            messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                tool_calls += 1
                content = tool_result(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        answer = message.content or ""
        return reward(answer, task), {"answer": answer, "tool_calls": tool_calls}

    return run_episode


def main() -> None:
    serve(episode_player, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
