"""The OpenAI-compatible gateway of a real rollout service (HF engine, the shipped tools policy) on loopback,
called with the official ``openai`` SDK pointed at a session's base URL; sessions opened and read back over
gRPC with the RolloutClient.

The tools policy calls the calculator on about a quarter of its samples, so the tool-loop test first finds,
outside any session, a seed whose first reply is a call (a seed fixes a request's samples whatever else is in
the batch), then replays it in a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from agents import Agent, MaxTurnsExceeded, ModelSettings, OpenAIResponsesModel, Runner
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from transformers import AutoModelForCausalLM

from examples.agents import (  # importing them turns the SDKs' tracing off
    agents_sdk_agent,
    langgraph_agent,
)
from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.errors import NotFound
from rollout_service.client import RolloutClient
from rollout_service.core.rollout import INLINE_TOKENS
from rollout_service.gateway import service as gateway_service
from rollout_service.gateway.conversation import ConversationRenderer
from rollout_service.gateway.http_app import INLINE_BODY_BYTES
from rollout_service.gateway.metrics import SessionMetrics
from rollout_service.gateway.service import AgentGateway, engine_session
from rollout_service.gateway.sessions import CallRecord, SampledChoice
from rollout_service.gateway.trajectory import trajectory
from rollout_service.gateway.types import Message
from rollout_service.server import binding, build_core, build_gateway
from rollout_service.settings import GatewaySettings, RolloutSettings
from tests.support.episodes import evaluate
from tests.support.hostile_inputs import nested_schema
from tests.support.server_thread import server_thread

TOOL_POLICY = Path(__file__).resolve().parents[3] / "models" / "tools"
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
QUESTION = {"role": "user", "content": "What is 347 + 582?"}
GATEWAY = GatewaySettings(
    port=0,
    max_body_bytes=64 * 1024,
    max_messages=8,
    max_n=4,
    max_tokens=64,
    max_tools=2,
    max_sessions=6,
    max_calls_per_session=3,
    session_ttl_s=120,
)


class Running:
    def __init__(self, server, core, endpoint, gateway) -> None:
        self.server, self.core, self.endpoint, self.gateway = server, core, endpoint, gateway

    def base_url(self, session_id: str | None = None) -> str:
        prefix = f"/sessions/{session_id}" if session_id else ""
        return f"http://127.0.0.1:{self.endpoint.port}{prefix}/v1"

    def sdk(self, session_id: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url(session_id), api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def running():
    settings = RolloutSettings(model=str(TOOL_POLICY), engine="hf", max_model_len=512, gateway=GATEWAY)
    built = {}

    async def build():
        core = await build_core(settings)
        gateway = build_gateway(core, settings)
        served = binding(core, gateway)
        built.update(core=core, endpoint=served.companions[0], gateway=gateway)
        return [served], core.close

    with server_thread(build) as server:
        yield Running(server, built["core"], built["endpoint"], built["gateway"])


@pytest.fixture
def rollout(running):
    with RolloutClient(running.server.address, timeout_s=60) as client:
        yield client


def ask(sdk: openai.OpenAI, messages, seed: int, max_tokens: int = 40, **fields):
    return sdk.chat.completions.create(
        model="tools",
        messages=messages,
        tools=[CALCULATOR],
        seed=seed,
        max_tokens=max_tokens,
        logprobs=True,
        extra_body={"return_token_ids": True},
        **fields,
    )


def test_a_tool_loop_through_the_sdk_is_one_exact_sequence(running, rollout):
    outside = running.sdk()
    seed = next(s for s in range(64) if ask(outside, [QUESTION], s).choices[0].message.tool_calls)

    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    messages = [QUESTION]
    first = ask(sdk, messages, seed)
    message = first.choices[0].message
    assert (
        first.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "calculator"
    )
    messages.append(message)  # the SDK's own message object, as agents hand it back
    for call in message.tool_calls:
        try:
            result = str(evaluate(json.loads(call.function.arguments)["expression"]))
        except (ValueError, KeyError, TypeError, SyntaxError) as exc:
            result = f"error: {exc}"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    engine = running.core.engine
    before = engine.prefill_tokens, engine.reused_tokens
    second = ask(sdk, messages, seed + 1)
    key = engine_session(ticket.session_id)
    assert key in engine.session_caches.sessions

    trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
    assert key not in engine.session_caches.sessions  # released with the session
    assert trajectory.calls == 2 and trajectory.prefix_mismatches == 0 and trajectory.retokenized_tokens == 0
    (sequence,) = trajectory.sequences
    first_ids = first.choices[0].model_extra["token_ids"]
    second_ids = second.choices[0].model_extra["token_ids"]
    # The second prompt is the first prompt and the ids the engine sampled, never decoded and encoded again.
    prompt1, prompt2 = first.model_extra["prompt_token_ids"], second.model_extra["prompt_token_ids"]
    assert prompt2[: len(prompt1) + len(first_ids)] == prompt1 + first_ids
    assert sequence.token_ids == prompt2 + second_ids
    # The engine kept the first call's KV: the second computed only the first reply's last id (sampled, never
    # fed) and the tool message.
    reused = len(prompt1) + len(first_ids) - 1
    assert engine.reused_tokens - before[1] == reused
    assert engine.prefill_tokens - before[0] == len(prompt2) - reused
    sampled = [t for t, m in zip(sequence.token_ids, sequence.loss_mask, strict=True) if m]
    assert sampled == first_ids + second_ids
    assert sequence.loss_mask == [0] * len(prompt1) + [1] * len(first_ids) + [0] * (
        len(prompt2) - len(prompt1) - len(first_ids)
    ) + [1] * len(second_ids)
    reported = [e.logprob for r in (first, second) for e in r.choices[0].logprobs.content]
    recorded = [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask, strict=True) if m]
    assert recorded == pytest.approx(reported, abs=1e-6)
    assert set(sequence.policy_versions) == {0}
    with pytest.raises(openai.NotFoundError):  # closed with the read
        ask(sdk, messages, seed)


RESPONSES_CALCULATOR = {"type": "function", **CALCULATOR["function"]}


def test_a_tool_loop_over_the_responses_api_is_one_exact_sequence_as_chat_would_give(running, rollout):
    """The Responses API serves the chat path: a first call that calls the calculator, then the SDK's own
    output items sent back with the tool's result, give the same ids, answer and single sequence as the
    same two turns over chat completions."""
    outside = running.sdk()
    seed = next(s for s in range(64) if ask(outside, [QUESTION], s).choices[0].message.tool_calls)
    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    inputs: list = [QUESTION]
    first = sdk.responses.create(
        model="tools",
        input=inputs,
        tools=[RESPONSES_CALCULATOR],
        max_output_tokens=40,
        metadata={"episode": "7"},
        extra_body={"seed": seed},
    )
    assert first.status == "completed" and first.object == "response"
    assert first.metadata == {"episode": "7"}
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "calculator" and call.call_id
    inputs += [item.model_dump(exclude_none=True) for item in first.output]  # as the Agents SDK sends them
    inputs.append({"type": "function_call_output", "call_id": call.call_id, "output": "929"})
    second = sdk.responses.create(
        model="tools",
        input=inputs,
        tools=[RESPONSES_CALCULATOR],
        max_output_tokens=40,
        extra_body={"seed": seed + 1},
    )
    trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
    assert trajectory.calls == 2 and trajectory.prefix_mismatches == 0 and trajectory.retokenized_tokens == 0
    (sequence,) = trajectory.sequences
    assert second.usage.input_tokens + second.usage.output_tokens == len(sequence.token_ids)
    # The same two turns over chat completions, in a session of their own.
    chat_ticket = rollout.open_agent_session()
    chat = running.sdk(chat_ticket.session_id)
    reply = ask(chat, [QUESTION], seed).choices[0].message
    messages = [QUESTION, reply, {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "929"}]
    again = ask(chat, messages, seed + 1).choices[0].message
    assert (again.content or "") == second.output_text
    (chat_sequence,) = rollout.agent_trajectory(chat_ticket.session_id, close=True).sequences
    assert chat_sequence.token_ids == sequence.token_ids and chat_sequence.loss_mask == sequence.loss_mask


def test_a_turn_sent_as_previous_response_id_is_the_sequence_the_whole_conversation_gives(running, rollout):
    """An agent that chains responses (``previous_response_id``, the Agents SDK's
    ``auto_previous_response_id``) sends only its new message on the next turn: the gateway prepends the
    stored conversation, so the two turns give the ids, answer and single sequence of the same turns sent
    whole. The instructions, sent again, come first and are not repeated."""
    fields = {"model": "tools", "instructions": "Use the calculator.", "tools": [RESPONSES_CALCULATOR]}
    fields["max_output_tokens"] = 24
    follow_up = {"role": "user", "content": "And 929 - 582?"}

    def two_turns(chained: bool):
        ticket = rollout.open_agent_session()
        sdk = running.sdk(ticket.session_id)
        first = sdk.responses.create(input=[QUESTION], **fields, extra_body={"seed": 5})
        if chained:
            second = sdk.responses.create(
                input=[follow_up], previous_response_id=first.id, **fields, extra_body={"seed": 6}
            )
            assert second.previous_response_id == first.id and second.instructions == fields["instructions"]
        else:
            whole = [QUESTION, *(item.model_dump(exclude_none=True) for item in first.output), follow_up]
            second = sdk.responses.create(input=whole, **fields, extra_body={"seed": 6})
        return second, rollout.agent_trajectory(ticket.session_id, close=True)

    chained, trajectory = two_turns(chained=True)
    whole, whole_trajectory = two_turns(chained=False)
    assert trajectory.calls == 2 and trajectory.prefix_mismatches == 0 and trajectory.retokenized_tokens == 0
    (sequence,) = trajectory.sequences
    (whole_sequence,) = whole_trajectory.sequences
    assert sequence.token_ids == whole_sequence.token_ids and sequence.loss_mask == whole_sequence.loss_mask
    assert chained.output_text == whole.output_text
    assert chained.usage.input_tokens + chained.usage.output_tokens == len(sequence.token_ids)


def test_the_agents_sdk_chaining_responses_sends_only_new_items_and_gives_one_sequence(running, rollout):
    """The OpenAI Agents SDK's ``auto_previous_response_id``: after a calculator call its second request
    carries the previous response's id and only the tool's output; the session is still one exact
    sequence. Seeds are tried until the policy calls the calculator (about a third of its answers)."""
    sent: list[dict] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    async def episode(session_id: str, seed: int) -> None:
        http = httpx.AsyncClient(event_hooks={"request": [record]})
        client = openai.AsyncOpenAI(
            base_url=running.base_url(session_id), api_key="unused", max_retries=0, http_client=http
        )
        agent = Agent(
            name="calculator agent",
            tools=[agents_sdk_agent.calculator_tool],
            model=OpenAIResponsesModel(model="tools", openai_client=client),
            model_settings=ModelSettings(max_tokens=16, extra_body={"seed": seed}),
        )
        with contextlib.suppress(MaxTurnsExceeded):
            await Runner.run(agent, [QUESTION], max_turns=2, auto_previous_response_id=True)
        await http.aclose()

    for seed in range(32):
        sent.clear()
        ticket = rollout.open_agent_session()
        asyncio.run(episode(ticket.session_id, seed))
        trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
        if trajectory.calls == 2:
            break
    assert len(sent) == 2 and "previous_response_id" not in sent[0], sent
    assert sent[1]["previous_response_id"].startswith("resp_")
    assert [item["type"] for item in sent[1]["input"]] == ["function_call_output"]
    assert trajectory.prefix_mismatches == 0 and trajectory.retokenized_tokens == 0
    assert len(trajectory.sequences) == 1


def test_a_langgraph_tool_loop_is_one_exact_sequence(running, rollout):
    """LangGraph's loop (the example's graph: ``ChatOpenAI`` with the tool bound, a ``ToolNode``) sends the
    model's reply back as LangChain converted it: the gateway still reuses its exact ids. Seeds are tried
    until the policy calls the calculator."""
    graph = langgraph_agent.agent_graph()

    async def episode(session_id: str, seed: int) -> None:
        model = ChatOpenAI(
            model="tools", base_url=running.base_url(session_id), api_key="unused", max_tokens=16, seed=seed
        ).bind_tools([langgraph_agent.calculator_tool])
        with contextlib.suppress(GraphRecursionError):
            await graph.ainvoke(
                {"messages": [QUESTION]}, {"recursion_limit": 4}, context=langgraph_agent.Episode(model)
            )

    for seed in range(32):
        ticket = rollout.open_agent_session()
        asyncio.run(episode(ticket.session_id, seed))
        trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
        if trajectory.calls == 2:
            break
    assert trajectory.calls == 2 and len(trajectory.sequences) == 1
    assert trajectory.prefix_mismatches == 0 and trajectory.retokenized_tokens == 0


def test_previous_response_id_names_only_a_stored_response_of_the_same_session(running, rollout):
    """A response made with ``store: false``, or by another session, is not found (404 naming the field);
    nothing is counted against the session's calls. A stored conversation counts toward
    ``gateway.max_messages`` with the input."""
    first, second = rollout.open_agent_sessions(2)
    sdk, other = running.sdk(first.session_id), running.sdk(second.session_id)
    fields = {"model": "tools", "max_output_tokens": 2}
    unstored = sdk.responses.create(input=[QUESTION], store=False, **fields)
    stored = sdk.responses.create(input=[QUESTION] * 7, **fields)  # 8 messages with its reply
    assert not unstored.store and stored.store
    session_base = running.base_url(first.session_id)
    for client, response_id in [(sdk, unstored.id), (other, stored.id), (sdk, "resp_unknown")]:
        with pytest.raises(openai.NotFoundError) as info:
            client.responses.create(input=[QUESTION], previous_response_id=response_id, **fields)
        assert info.value.body["param"] == "previous_response_id"
    body = json.dumps({**fields, "input": [QUESTION], "previous_response_id": stored.id}).encode()
    assert_error(post(session_base + "/responses", body), 413, "input", "gateway.max_messages")
    sdk.responses.create(input=[QUESTION], **fields)  # the third of gateway.max_calls_per_session = 3
    for ticket in (first, second):
        rollout.close_agent_session(ticket.session_id)


def test_a_response_answered_empty_for_a_spent_budget_is_not_kept(running, rollout):
    """Nothing was generated or recorded for it, so there is no record to read its conversation from."""
    ticket = rollout.open_agent_session(max_completion_tokens=1)
    sdk = running.sdk(ticket.session_id)
    first = sdk.responses.create(model="tools", input=[QUESTION], max_output_tokens=4)
    spent = sdk.responses.create(model="tools", input="More?", previous_response_id=first.id)
    assert spent.status == "incomplete" and spent.usage.output_tokens == 0
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="tools", input="And?", previous_response_id=spent.id)
    assert rollout.agent_trajectory(ticket.session_id, close=True).calls == 1


def test_a_response_with_output_text_logprobs_gives_the_recorded_ones(running, rollout):
    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    answer = sdk.responses.create(
        model="tools", input=[QUESTION], max_output_tokens=12, include=["message.output_text.logprobs"]
    )
    (sequence,) = rollout.agent_trajectory(ticket.session_id, close=True).sequences
    recorded = [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask, strict=True) if m]
    [part] = next(item for item in answer.output if item.type == "message").content
    assert [entry.logprob for entry in part.logprobs] == pytest.approx(recorded, abs=1e-6)
    assert len(part.logprobs) == answer.usage.output_tokens


def test_a_streamed_response_is_the_apis_events_ending_in_the_whole_response(running, rollout):
    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    fields = {"model": "tools", "input": [QUESTION], "tools": [RESPONSES_CALCULATOR], "max_output_tokens": 30}
    whole = sdk.responses.create(**fields, extra_body={"seed": 3})
    events = list(sdk.responses.create(**fields, stream=True, extra_body={"seed": 3}))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    final = events[-1].response
    assert [item.type for item in final.output] == [item.type for item in whole.output]
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert text == whole.output_text
    assert arguments == [item.arguments for item in whole.output if item.type == "function_call"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert done == [item.id for item in final.output]
    assert rollout.agent_trajectory(ticket.session_id, close=True).calls == 2


@pytest.mark.parametrize(
    ("fields", "status", "param", "needle"),
    [
        ({"stream": "yes"}, 400, "stream", "boolean"),
        ({"previous_response_id": "resp_1"}, 400, "previous_response_id", "only within a session"),
        ({"conversation": "conv_1"}, 400, "conversation", "previous_response_id"),
        ({"input": [QUESTION] * 9}, 413, "input", "gateway.max_messages"),
        ({"input": []}, 400, "input", "non-empty"),
        ({"input": [{"type": "reasoning", "summary": []}]}, 400, "input[0].type", "function_call_output"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "input[0].content[0].type",
            "text parts",
        ),
        ({"input": [QUESTION, {"type": "function_call_output", "output": "1"}]}, 400, "input[1].call_id", ""),
        ({"input": [QUESTION, {"role": "user", "content": {"x": 1}}]}, 400, "input[1].content", ""),
        ({"max_output_tokens": 65}, 400, "max_output_tokens", "gateway.max_tokens"),
        ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type", "function"),
        ({"tools": [{"type": "function", "name": "a b"}]}, 400, "tools[0].name", "letters"),
        ({"tools": [RESPONSES_CALCULATOR] * 3}, 413, "tools", "gateway.max_tools"),
        ({"tools": [RESPONSES_CALCULATOR] * 2}, 400, "tools[1].name", "also the name of tools[0]"),
        (
            {"tools": [RESPONSES_CALCULATOR], "tool_choice": {"type": "function", "name": "x"}},
            400,
            "tool_choice.name",
            "",
        ),
        ({"text": {"format": {"type": "json_object"}}}, 400, "text.format", "text"),
        ({"instructions": 5}, 400, "instructions", "string"),
        ({"metadata": {str(i): "v" for i in range(17)}}, 400, "metadata", "16 key-value pairs"),
        ({"metadata": {"run": "v" * 513}}, 400, "metadata.run", "512 characters"),
    ],
)
def test_bad_responses_requests_name_the_field_as_the_caller_wrote_it(running, fields, status, param, needle):
    body = json.dumps({"model": "tools", "input": [QUESTION], "max_output_tokens": 4, **fields}).encode()
    assert_error(post(running.base_url() + "/responses", body), status, param, needle)


def test_streaming_gives_the_same_answer_as_a_whole_one(running, rollout):
    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    whole = ask(sdk, [QUESTION], 5)
    stream = ask(sdk, [QUESTION], 5, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    expected = whole.choices[0].message
    assert content == (expected.content or "")
    assert [t.function.arguments for t in calls] == [t.function.arguments for t in expected.tool_calls or []]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
    assert trajectory.calls == 2 and len(trajectory.sequences) == 2  # the same question twice: two roots


def test_a_branching_session_gives_one_sequence_per_branch(running, rollout):
    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    first = sdk.chat.completions.create(
        model="tools", messages=[QUESTION], n=2, seed=1, max_tokens=20, extra_body={"return_token_ids": True}
    )
    reply = first.choices[1].message
    follow = [QUESTION, reply, {"role": "user", "content": "Sure?"}]
    if reply.tool_calls:
        follow[2] = {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": "929"}
    sdk.chat.completions.create(model="tools", messages=follow, seed=2, max_tokens=20)
    trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
    assert trajectory.calls == 2 and trajectory.prefix_mismatches == 0
    lone, continued = trajectory.sequences  # sample 0 alone; sample 1 and the call that continued it
    prompt = first.model_extra["prompt_token_ids"]
    ids0, ids1 = (c.model_extra["token_ids"] for c in first.choices)
    assert lone.token_ids == prompt + ids0 and lone.loss_mask == [0] * len(prompt) + [1] * len(ids0)
    assert continued.token_ids[: len(prompt) + len(ids1)] == prompt + ids1
    assert continued.loss_mask[len(prompt) : len(prompt) + len(ids1)] == [1] * len(ids1)


def test_completions_and_models(running, rollout):
    sdk = running.sdk()
    models = sdk.models.list()
    assert [m.id for m in models.data] == ["tools"]
    out = sdk.completions.create(model="tools", prompt="347 + 582 =", max_tokens=5, seed=0, logprobs=0)
    assert out.object == "text_completion" and out.usage.completion_tokens == len(
        out.choices[0].logprobs.tokens
    )


# ------------------------------------------------------------------ bad input
def post(url: str, body: bytes) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def chat_body(**fields) -> bytes:
    return json.dumps({"model": "tools", "messages": [QUESTION], "max_tokens": 4, **fields}).encode()


def assert_error(reply, status: int, param: str | None, needle: str = "") -> dict:
    code, headers, body = reply
    assert code == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert needle in error["message"], error
    return headers


def test_the_status_and_each_session_ticket_name_the_gateways_bound_port(running, rollout):
    assert rollout.status().openai_port == running.endpoint.port > 0
    tickets = [rollout.open_agent_session(), *rollout.open_agent_sessions(3)]
    assert {ticket.openai_port for ticket in tickets} == {running.endpoint.port}
    for ticket in tickets:
        rollout.close_agent_session(ticket.session_id)


def test_a_pinned_session_samples_its_distribution_whatever_the_agent_asks(running, rollout):
    greedy = ask(running.sdk(), [QUESTION], 0, temperature=0, max_tokens=6).choices[0]
    ticket = rollout.open_agent_session(sampling={"temperature": 0.0, "max_tokens": 6})
    sdk = running.sdk(ticket.session_id)
    # The agent asks for hot sampling and more tokens; the session pins greedy decoding and caps the length.
    replies = [ask(sdk, [QUESTION], seed, temperature=1.5, max_tokens=40).choices[0] for seed in (1, 2)]
    rollout.close_agent_session(ticket.session_id)
    for reply in replies:
        assert reply.model_extra["token_ids"] == greedy.model_extra["token_ids"]
        assert len(reply.model_extra["token_ids"]) <= 6
    for sampling, field in (
        ({"temperature": -1.0}, "sampling.temperature"),
        ({"top_p": 0.0}, "sampling.top_p"),
    ):
        with pytest.raises(ServiceCallError) as info:
            rollout.open_agent_session(sampling=sampling)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and field in str(info.value)


def test_a_sessions_completion_budget_caps_each_call_at_what_is_left(running, rollout):
    """Token-id completions, so the budget's arithmetic is exact: the budget counts the tokens after the
    first call's prompt, sampled and agent-written alike."""

    def complete(session_id: str, prompt: list[int], max_tokens: int) -> dict:
        body = {"model": "tools", "prompt": prompt, "max_tokens": max_tokens, "seed": 0, "logprobs": 0}
        code, _, reply = post(
            running.base_url(session_id) + "/completions",
            json.dumps({**body, "return_token_ids": True}).encode(),
        )
        assert code == 200, reply
        return reply["choices"][0]

    question = running.core.tokenizer("What is 347 + 582?")["input_ids"]
    ticket = rollout.open_agent_session(max_completion_tokens=6)
    first = complete(ticket.session_id, question, 2)["token_ids"]
    extended = [*question, *first, 11]  # one token the agent wrote after the reply
    second = complete(ticket.session_id, extended, 40)
    assert 1 <= len(second["token_ids"]) <= 6 - len(first) - 1  # capped at what was left
    spent = [*extended, *second["token_ids"], *([11] * 6)]
    third = complete(ticket.session_id, spent, 40)
    assert third["token_ids"] == [] and third["finish_reason"] == "length"
    assert third["logprobs"]["tokens"] == [] and len(second["logprobs"]["tokens"]) == len(second["token_ids"])
    trajectory = rollout.agent_trajectory(ticket.session_id, close=True)
    assert trajectory.calls == 2  # the spent call generated and recorded nothing
    (sequence,) = trajectory.sequences
    assert sequence.token_ids == [*extended, *second["token_ids"]]
    assert len(sequence.token_ids) - len(question) <= 6
    with pytest.raises(ServiceCallError) as info:
        rollout.open_agent_session(max_completion_tokens=0)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_completion_tokens" in str(info.value)


def test_unknown_and_expired_sessions_are_404(running, rollout):
    assert_error(
        post(running.base_url("not-a-session") + "/chat/completions", chat_body()), 404, "session_id"
    )
    ticket = rollout.open_agent_session(ttl_s=0.5)
    time.sleep(1.0)
    assert_error(
        post(running.base_url(ticket.session_id) + "/chat/completions", chat_body()), 404, "session_id"
    )
    with pytest.raises(ServiceCallError) as info:
        rollout.agent_trajectory(ticket.session_id)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    gateway = AgentGateway(running.core, GatewaySettings(serve_without_session=False), "tools")
    with pytest.raises(NotFound, match="serve_without_session"):
        gateway.check_session(None)


@pytest.mark.parametrize(
    ("fields", "status", "param", "needle"),
    [
        ({"messages": [QUESTION] * 9}, 413, "messages", "gateway.max_messages"),
        ({"n": 5}, 400, "n", "gateway.max_n"),
        ({"max_tokens": 65}, 400, "max_tokens", "gateway.max_tokens"),
        ({"tools": [CALCULATOR] * 3}, 413, "tools", "gateway.max_tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
            400,
            "tools[0].function.parameters",
            "JSON Schema",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": nested_schema(100)}}]},
            400,
            "tools[0].function.parameters",
            "nested deeper than 32 levels",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$schema": 5}}}]},
            400,
            "tools[0].function.parameters",
            "$schema must be a string",
        ),
        ({"messages": [{"role": "user", "content": {"x": 1}}]}, 400, "messages[0].content", ""),
        ({"logprobs": True, "top_logprobs": 3}, 400, "top_logprobs", "sampled token"),
        ({"temperature": 1000}, 400, "temperature", ""),
    ],
)
def test_bad_requests_name_the_field_or_limit(running, fields, status, param, needle):
    assert_error(post(running.base_url() + "/chat/completions", chat_body(**fields)), status, param, needle)


def test_malformed_and_oversized_bodies(running):
    url = running.base_url() + "/chat/completions"
    assert_error(post(url, b'{"messages": ['), 400, None, "not valid JSON")
    assert_error(post(url, b"[1, 2]"), 400, "body")
    big = chat_body(messages=[{"role": "user", "content": "x" * 70_000}])
    assert_error(post(url, big), 413, "body", "gateway.max_body_bytes")
    assert_error(post(running.base_url() + "/completions", b'{"prompt": 5}'), 400, "prompt")


def session_metrics(running) -> dict[str, float]:
    """The rollout service's session metrics as a scrape reads them."""
    collector = SessionMetrics(running.core.engine, running.gateway.sessions)
    return {sample.name: sample.value for family in collector.collect() for sample in family.samples}


def test_the_session_metrics_count_what_a_session_holds_until_it_closes(running, rollout):
    ticket = rollout.open_agent_session()  # opening drops the sessions of earlier tests that expired
    before = session_metrics(running)
    assert post(running.base_url(ticket.session_id) + "/chat/completions", chat_body())[0] == 200
    during = session_metrics(running)
    held = running.gateway.sessions.get(ticket.session_id).held_tokens
    assert held > 0
    assert (
        during["grpo_rollout_gateway_recorded_tokens"]
        == before["grpo_rollout_gateway_recorded_tokens"] + held
    )
    assert (
        during["grpo_rollout_session_cache_bytes"] > before["grpo_rollout_session_cache_bytes"]
    )  # its reply's KV
    assert during["grpo_rollout_session_cache_evictions_total"] == 0
    rollout.close_agent_session(ticket.session_id)
    closed = {**before, "grpo_rollout_gateway_sessions": before["grpo_rollout_gateway_sessions"] - 1}
    assert session_metrics(running) == closed


def test_a_long_sessions_trajectory_is_laid_out_off_the_event_loop(running, rollout, monkeypatch):
    threads = []

    def laid_out(record):
        threads.append(threading.current_thread())
        return trajectory(record)

    monkeypatch.setattr(gateway_service, "trajectory", laid_out)
    short, long = rollout.open_agent_session(), rollout.open_agent_session()
    ids = list(range(INLINE_TOKENS + 1))  # past what is laid out on the loop
    choice = SampledChoice([7], [-0.5], [3], "", Message("assistant", ""))
    for ticket, prompt in ((short, ids[:8]), (long, ids)):
        session = running.gateway.sessions.get(ticket.session_id)
        running.gateway.sessions.record(session, CallRecord(0, "chat", prompt, [choice], 3))
    assert rollout.agent_trajectory(short.session_id, close=True).sequences[0].token_ids == [*ids[:8], 7]
    (sequence,) = rollout.agent_trajectory(long.session_id, close=True).sequences
    assert sequence.token_ids == [*ids, 7] and sequence.loss_mask[-2:] == [0, 1]
    assert sequence.logprobs[-1] == -0.5 and sequence.policy_versions[-1] == 3
    on_loop, off_loop = threads
    assert off_loop is not on_loop


def test_a_chained_response_is_rendered_off_the_event_loop(running, rollout, monkeypatch):
    """A short body may continue a long stored conversation: a call with ``previous_response_id`` renders
    its prompt in a worker thread, a short call without one on the loop."""
    threads = []
    render = ConversationRenderer.chat_prompt

    def rendered(self, *args):
        threads.append(threading.current_thread())
        return render(self, *args)

    monkeypatch.setattr(ConversationRenderer, "chat_prompt", rendered)
    ticket = rollout.open_agent_session()
    sdk = running.sdk(ticket.session_id)
    first = sdk.responses.create(model="tools", input=[QUESTION], max_output_tokens=4)
    sdk.responses.create(model="tools", input="Sure?", previous_response_id=first.id, max_output_tokens=4)
    rollout.close_agent_session(ticket.session_id)
    on_loop, off_loop = threads
    assert off_loop is not on_loop


def test_a_call_past_the_recorded_tokens_bound_is_429_until_sessions_close(running, rollout):
    registry = running.gateway.sessions
    first = rollout.open_agent_session()
    assert post(running.base_url(first.session_id) + "/chat/completions", chat_body())[0] == 200
    question = running.core.tokenizer("What is 347 + 582?")["input_ids"]
    spent = rollout.open_agent_session(max_completion_tokens=1)
    spent_url = running.base_url(spent.session_id) + "/completions"

    def completion(prompt: list[int]) -> bytes:
        return json.dumps(
            {"model": "tools", "prompt": prompt, "max_tokens": 4, "return_token_ids": True}
        ).encode()

    code, _, reply = post(spent_url, completion(question))
    assert code == 200 and len(reply["choices"][0]["token_ids"]) == 1
    limit = registry.max_recorded_tokens
    registry.max_recorded_tokens = registry.held_tokens + 1  # no room for another call's prompt
    second = rollout.open_agent_session()
    url = running.base_url(second.session_id) + "/chat/completions"
    try:
        headers = assert_error(post(url, chat_body()), 429, "gateway.max_recorded_tokens", "close finished")
        assert int(headers["Retry-After"]) >= 1
        assert rollout.agent_trajectory(second.session_id).calls == 0  # nothing generated or recorded
        # A call whose budget is spent records nothing, so it is answered (empty) whatever the bound.
        code, _, reply = post(spent_url, completion([*question, *reply["choices"][0]["token_ids"]]))
        assert code == 200 and reply["choices"][0]["token_ids"] == []
        rollout.close_agent_session(first.session_id)  # frees what its call held
        assert post(url, chat_body())[0] == 200
    finally:
        registry.max_recorded_tokens = limit
        rollout.close_agent_session(second.session_id)
        rollout.close_agent_session(spent.session_id)


def test_sessions_and_calls_over_their_bounds(running, rollout):
    ticket = rollout.open_agent_session()
    url = running.base_url(ticket.session_id) + "/chat/completions"
    for _ in range(GATEWAY.max_calls_per_session):
        assert post(url, chat_body())[0] == 200
    headers = assert_error(post(url, chat_body()), 429, "gateway.max_calls_per_session")
    assert int(headers["Retry-After"]) >= 1
    rollout.close_agent_session(ticket.session_id)
    opened = [rollout.open_agent_session() for _ in range(GATEWAY.max_sessions)]
    try:
        with pytest.raises(ServiceCallError) as info:
            rollout.open_agent_session()
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "gateway.max_sessions" in str(
            info.value
        )
    finally:
        for t in opened:
            rollout.close_agent_session(t.session_id)


def test_a_steps_sessions_open_in_one_call(running, rollout):
    """OpenAgentSessions opens sessions alike (here pinned to greedy sampling), each its own, all or none."""
    tickets = rollout.open_agent_sessions(3, sampling={"temperature": 0.0, "max_tokens": 6})
    try:
        assert len({t.session_id for t in tickets}) == 3
        replies = [ask(running.sdk(t.session_id), [QUESTION], seed=0, temperature=1.5) for t in tickets]
        assert len({tuple(r.choices[0].token_ids) for r in replies}) == 1  # greedy: the same 6 tokens
        for ticket in tickets:
            assert rollout.agent_trajectory(ticket.session_id).calls == 1
        for count, code in ((0, grpc.StatusCode.INVALID_ARGUMENT), (7, grpc.StatusCode.RESOURCE_EXHAUSTED)):
            with pytest.raises(ServiceCallError) as info:
                rollout.open_agent_sessions(count)
            assert info.value.code == code and "count" in str(info.value)
        with pytest.raises(ServiceCallError) as full:  # 3 open + 4 > 6: none opened
            rollout.open_agent_sessions(4)
        assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "gateway.max_sessions" in str(
            full.value
        )
        tickets += rollout.open_agent_sessions(3)  # 3 + 3 = 6 fit: the refused call opened none
    finally:
        for ticket in tickets:
            rollout.close_agent_session(ticket.session_id)


def test_a_session_closed_during_its_call_keeps_no_kv_cache(running, rollout):
    """Whether the close lands before, during or after the call, the engine keeps nothing for the session
    once both are done."""
    ticket = rollout.open_agent_session()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(ask, running.sdk(ticket.session_id), [QUESTION], 0, 64, temperature=1.0)
        time.sleep(0.02)
        assert rollout.close_agent_session(ticket.session_id)
        with contextlib.suppress(openai.NotFoundError):  # closed before the call was admitted
            call.result(timeout=60)
    assert engine_session(ticket.session_id) not in running.core.engine.session_caches.sessions


def test_a_body_too_large_to_decode_inline_is_served_the_same(running):
    """A body over INLINE_BODY_BYTES is decoded and its prompt rendered in a worker thread: the same answer
    (greedy) as the same request in a small body. The bulk is a field the gateway ignores (``user``)."""
    sdk = running.sdk()
    small, large = (
        ask(sdk, [QUESTION], seed=3, max_tokens=6, temperature=0.0, user=user) for user in ("a", "a" * 4096)
    )
    assert len(chat_body(user="a" * 4096)) > INLINE_BODY_BYTES
    assert large.choices[0].token_ids == small.choices[0].token_ids


def test_a_sessions_calls_wait_for_the_version_it_was_opened_for(running, rollout):
    """A trainer opens a step's sessions while it pushes that step's weights: the agent's first call is held
    until the version serves, then sampled by it. (The push is of the same weights, so later tests see the
    same policy.)"""
    with pytest.raises(ServiceCallError) as info:
        rollout.open_agent_session(min_policy_version=2**64 - 1)  # no push can reach it: refused, not waited
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "min_policy_version" in str(info.value)
    served = rollout.status().policy_version
    ticket = rollout.open_agent_session(min_policy_version=served + 1)
    url = running.base_url(ticket.session_id) + "/chat/completions"
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(post, url, chat_body())
        time.sleep(0.3)  # far past the batch window: it would have been answered by now
        assert not call.done()
        layer = "model.norm.weight"
        base = AutoModelForCausalLM.from_pretrained(TOOL_POLICY).state_dict()
        rollout.push_state_dict({layer: base[layer]}, served + 1)
        status, _, _ = call.result(timeout=60)
    assert status == 200
    [sequence] = rollout.agent_trajectory(ticket.session_id, close=True).sequences
    sampled = [v for v, m in zip(sequence.policy_versions, sequence.loss_mask, strict=True) if m]
    assert sampled and set(sampled) == {served + 1}
