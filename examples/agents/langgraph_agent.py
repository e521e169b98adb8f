"""A calculator agent written with LangGraph: a ``StateGraph`` of a model node (LangChain's ``ChatOpenAI``
with the tool bound) and a prebuilt ``ToolNode``, routed by ``tools_condition`` — LangGraph's tool-calling
agent loop — served over ``grpo.agent.v1`` so the trainer can train the policy it calls. Only the base URL
ties it to the trainer.

The graph is compiled once; each episode gives it a ``ChatOpenAI`` of its own base URL (the episode's gateway
session) as the run's context (LangGraph's ``context_schema``). The model objects share one HTTP client per
process, as LangChain's ``http_async_client`` and ``http_client`` let them: each builds its OpenAI clients in
about 0.3 ms of CPU instead of about 40 ms for the SSL contexts of clients of its own. LangSmith tracing is
turned off: it would send every run to api.smith.langchain.com.

    python -m examples.agents.langgraph_agent --port 50060     # from the repository root
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx
from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.runtime import Runtime

from examples.agents.calculator_task import (
    CALCULATOR_DESCRIPTION,
    Sampling,
    calculator,
    question_messages,
    reward,
    serve,
)
from examples.agents.openai_client import shared_http_client
from grpo_runtime.agent_server import RunEpisode

os.environ["LANGSMITH_TRACING"] = "false"


@tool("calculator", description=CALCULATOR_DESCRIPTION)
def calculator_tool(expression: str) -> str:
    """Evaluates an arithmetic expression (numbers, + - * / and parentheses), for example 347 + 582."""
    return calculator(expression)


@dataclass(frozen=True)
class Episode:
    """What one run of the graph uses: the episode's model, its tools bound."""

    model: Runnable[list[AnyMessage], AIMessage]


async def call_model(state: MessagesState, runtime: Runtime[Episode]) -> dict[str, list[AnyMessage]]:
    """The model node: the episode's model answers the conversation."""
    return {"messages": [await runtime.context.model.ainvoke(state["messages"])]}


def agent_graph():
    """model → tools while the model calls one → model … → end: LangGraph's tool-calling loop."""
    graph = StateGraph(MessagesState, context_schema=Episode)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([calculator_tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def episode_player(sampling: Sampling) -> RunEpisode:
    """``run_episode(task, base_url, deadline)``: the graph answers the row's question within
    ``sampling.max_turns`` model calls (a graph that would take more scores 0)."""

    graph = agent_graph()
    http_async, http_sync = shared_http_client(), httpx.Client()

    async def run_episode(task: dict[str, Any], base_url: str, deadline: float | None):
        model = ChatOpenAI(
            model=sampling.model,
            base_url=base_url,
            api_key="unused",
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            max_retries=0,
            http_async_client=http_async,
            http_client=http_sync,
        ).bind_tools([calculator_tool])
        # A graph step per model call and per tool step: max_turns calls take 2 * max_turns - 1 steps, and
        # LangGraph raises GraphRecursionError instead of taking its recursion_limit-th.
        config: RunnableConfig = {"recursion_limit": 2 * sampling.max_turns}
        try:
            state = await graph.ainvoke({"messages": question_messages(task)}, config, context=Episode(model))
        except GraphRecursionError as error:  # the policy's doing: a bad episode
            return (0.0 if task.get("answer") else None), {"error": f"GraphRecursionError: {error}"}
        replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
        answer = replies[-1].text if replies else ""
        return reward(answer, task), {"answer": answer, "model_calls": len(replies)}

    return run_episode


def main() -> None:
    serve(episode_player, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
