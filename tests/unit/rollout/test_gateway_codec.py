"""The gateway's OpenAI codec: requests read strictly (errors name the field as the caller wrote it, counts
name the server's limit) and answers in the shape vLLM's server gives."""

from __future__ import annotations

import pytest

from grpo_runtime.errors import InvalidArgument, ResourceExhausted
from rollout_service.gateway import openai_codec, responses_codec
from rollout_service.gateway.types import Answer, Choice, FunctionCall, Message
from rollout_service.settings import GatewaySettings
from rollout_service.types import FinishReason
from tests.support.hostile_inputs import nested_schema

SETTINGS = GatewaySettings(max_messages=3, max_tools=1, max_n=2, max_tokens=50)
USER = {"role": "user", "content": "hi"}
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def function_tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def chat(**fields):
    return openai_codec.decode_chat_request({"messages": [USER], **fields}, SETTINGS)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [USER, {"role": "robot", "content": "x"}]}, "messages[1].role"),
        ({"messages": [USER, {"role": "user", "content": 7}]}, "messages[1].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
        ({"messages": [USER], "n": 3}, "n"),
        ({"messages": [USER], "n": True}, "n"),
        ({"messages": [USER], "max_tokens": 51}, "max_tokens"),
        ({"messages": [USER], "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": [USER], "temperature": "hot"}, "temperature"),
        ({"messages": [USER], "stop": [1]}, "stop[0]"),
        ({"messages": [USER], "logprobs": True, "top_logprobs": 5}, "top_logprobs"),
        ({"messages": [USER], "presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": [USER], "tools": [function_tool({"$schema": 5})]}, "tools[0].function.parameters"),
        ({"messages": [USER], "tools": [function_tool({"$schema": ["x"]})]}, "tools[0].function.parameters"),
        (
            {"messages": [USER], "tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        (
            {
                "messages": [USER],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}],
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "messages": [USER],
                "tools": [CALCULATOR],
                "tool_choice": {"type": "function", "function": {"name": "x"}},
            },
            "tool_choice.function.name",
        ),
        ({"messages": [USER], "tool_choice": "required"}, "tool_choice"),
        ([USER], "body"),
    ],
)
def test_bad_chat_fields_are_named(body, field):
    with pytest.raises(InvalidArgument) as info:
        openai_codec.decode_chat_request(body, SETTINGS)
    assert info.value.field == field


@pytest.mark.parametrize("objects", [17, 100, 2000])
def test_a_tool_schema_nested_too_deep_is_refused_by_name(objects):
    # 17 objects deep is 33 levels (each object's properties is one more); 100 would overflow the
    # schema check's recursion, 2000 any recursive walk.
    with pytest.raises(InvalidArgument, match="nested deeper than 32 levels") as info:
        chat(tools=[function_tool(nested_schema(objects))])
    assert info.value.field == "tools[0].function.parameters"


def test_a_tool_schema_within_the_nesting_limit_is_checked():
    assert chat(tools=[function_tool(nested_schema(16))]).tools[0]["function"]["parameters"] == nested_schema(
        16
    )


def test_two_tools_of_one_name_are_refused_naming_the_second():
    body = {"messages": [USER], "tools": [CALCULATOR, CALCULATOR]}
    with pytest.raises(InvalidArgument, match="also the name of tools\\[0\\]") as info:
        openai_codec.decode_chat_request(body, GatewaySettings(max_tools=2))
    assert info.value.field == "tools[1].function.name"


def test_a_remembered_schema_check_gives_each_call_its_own_answer():
    settings = GatewaySettings(max_tools=2)
    body = {"messages": [USER], "tools": [CALCULATOR, function_tool({"type": "object"})]}
    for _ in range(2):
        request = openai_codec.decode_chat_request(body, settings)
        assert [tool["function"]["parameters"] for tool in request.tools] == [
            CALCULATOR["function"]["parameters"],
            {"type": "object"},
        ]
    bad = {"type": "object", "properties": {"x": {"type": "nope"}}}
    for index in (0, 1):
        tools = [function_tool({"type": "object"})] * index + [function_tool(dict(bad))]
        with pytest.raises(InvalidArgument, match="not a valid JSON Schema: 'nope' is not valid") as info:
            openai_codec.decode_chat_request({"messages": [USER], "tools": tools}, settings)
        assert info.value.field == f"tools[{index}].function.parameters"
    large = {
        "type": "object",
        "description": "x" * openai_codec.SCHEMA_MEMO_MAX_CHARS,
        "properties": bad["properties"],
    }
    with pytest.raises(InvalidArgument, match="not a valid JSON Schema"):
        chat(tools=[function_tool(large)])


def test_counts_over_a_limit_name_it():
    with pytest.raises(ResourceExhausted, match=r"gateway\.max_messages"):
        openai_codec.decode_chat_request({"messages": [USER] * 4}, SETTINGS)
    with pytest.raises(ResourceExhausted, match=r"gateway\.max_tools"):
        chat(tools=[CALCULATOR, CALCULATOR])


def test_a_chat_request_maps_to_the_engines_sampling():
    request = chat(
        n=2,
        temperature=0.5,
        top_p=0.9,
        max_completion_tokens=7,
        stop="END",
        seed=-1,
        logprobs=True,
        tools=[CALCULATOR],
        tool_choice="none",
        stream=True,
        stream_options={"include_usage": True},
    )
    spec = request.sampling.spec
    assert (spec.temperature, spec.top_p, spec.max_tokens, spec.stop) == (0.5, 0.9, 7, ("END",))
    assert spec.seed == 2**63 - 1 and request.top_logprobs == 0 and request.tool_choice == "none"
    assert request.stream and request.include_usage and request.n == 2
    assert chat().sampling.max_tokens is None  # the context's room, decided once the prompt is known


def test_completion_prompts():
    decode = openai_codec.decode_completion_request
    assert decode({"prompt": "abc"}, SETTINGS).prompt == "abc"
    assert decode({"prompt": [[1, 2]]}, SETTINGS).prompt == (1, 2)
    assert decode({"prompt": "abc"}, SETTINGS).sampling.max_tokens == 16
    for bad in ({"prompt": ["a", "b"]}, {"prompt": ""}, {"prompt": [True]}, {"prompt": "a", "echo": True}):
        with pytest.raises(InvalidArgument):
            decode(bad, SETTINGS)


def test_answers_and_chunks_have_vllms_shape():
    message = Message("assistant", "", (FunctionCall("call_1", "calculator", '{"expression": "1+2"}'),))
    choice = Choice(0, [5, 6], [-0.5, -0.25], [1, 1], "x", FinishReason.STOP, message, ["a", "é"])
    answer = Answer("chatcmpl-1", "chat", 7, "tools", [1, 2, 3], [choice])
    out = openai_codec.encode_answer(answer, return_token_ids=True)
    assert out["object"] == "chat.completion" and out["prompt_token_ids"] == [1, 2, 3]
    (c,) = out["choices"]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    assert c["message"]["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": '{"expression": "1+2"}',
    }
    assert c["logprobs"]["content"][1] == {
        "token": "é",
        "logprob": -0.25,
        "bytes": [195, 169],
        "top_logprobs": [],
    }
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunks = list(openai_codec.chunks_of(answer, include_usage=True))
    assert {ch["object"] for ch in chunks} == {"chat.completion.chunk"}
    assert (
        chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["usage"]["total_tokens"] == 5
    )


def test_logprobs_are_null_unless_asked_for_and_empty_for_an_empty_completion():
    """As vLLM answers: ``logprobs: null`` when none were asked for; asked for, a completion without tokens
    (a session's spent budget) has an empty list, not null."""

    def encoded(kind: str, tokens: list[str] | None) -> dict:
        message = Message("assistant", "") if kind == "chat" else None
        choice = Choice(0, [], [], [], "", FinishReason.LENGTH, message, tokens)
        return openai_codec.encode_answer(Answer("id-1", kind, 7, "tools", [1], [choice]))["choices"][0]

    assert encoded("chat", None)["logprobs"] is None and encoded("completion", None)["logprobs"] is None
    assert encoded("chat", [])["logprobs"] == {"content": []}
    assert encoded("completion", [])["logprobs"] == {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }


def test_core_fields_are_renamed_to_the_callers():
    assert openai_codec.openai_field("sampling.top_p", "messages") == "top_p"
    assert openai_codec.openai_field("sampling.max_tokens", "messages") == "max_tokens"
    assert openai_codec.openai_field("prompts[0]", "messages") == "messages"
    assert openai_codec.openai_field("prompts", "prompt") == "prompt"
    assert openai_codec.openai_field("gateway.max_sessions", "prompt") == "gateway.max_sessions"


# ------------------------------------------------------------- Responses API
def test_a_responses_turn_reads_as_the_chat_messages_it_means():
    body = {
        "instructions": "Use the calculator.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "What is 2 + 2?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me."}]},
            {"type": "function_call", "call_id": "call_1", "name": "calculator", "arguments": '{"e": "2+2"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "4"},
        ],
        "tools": [{"type": "function", "name": "calculator", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "calculator"},
        "max_output_tokens": 7,
        "previous_response_id": "resp_1",
        "store": False,
    }
    responses = responses_codec.decode_responses_request(body, GatewaySettings(max_messages=4))
    assert responses.previous_response_id == "resp_1" and not responses.store
    assert responses.instructions == "Use the calculator."
    assert responses.input_messages == responses.chat.messages[1:]
    request = responses.chat
    assert request.messages == (
        Message("system", "Use the calculator."),
        Message("user", "What is 2 + 2?"),
        Message("assistant", "Let me.", (FunctionCall("call_1", "calculator", '{"e": "2+2"}'),)),
        Message("tool", "4", tool_call_id="call_1"),
    )
    assert request.tools[0]["function"]["name"] == "calculator" and request.tool_choice == "calculator"
    assert request.sampling.max_tokens == 7 and request.n == 1 and not request.stream


def test_a_responses_error_names_the_item_the_caller_wrote():
    body = {
        "instructions": "x",
        "input": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
    }
    with pytest.raises(InvalidArgument) as info:
        responses_codec.decode_responses_request(body, SETTINGS)
    assert info.value.field == "input[1].role"
    body = {"input": [{"role": "user", "content": "a"}], "max_output_tokens": 51}
    with pytest.raises(InvalidArgument) as info:
        responses_codec.decode_responses_request(body, SETTINGS)
    assert info.value.field == "max_output_tokens" and "gateway.max_tokens" in info.value.message
    with pytest.raises(ResourceExhausted) as info:  # refused at the fourth message, before reading the rest
        responses_codec.decode_responses_request(
            {"input": [{"role": "user", "content": "a"}] * 4 + [5]}, SETTINGS
        )
    assert info.value.field == "input" and "gateway.max_messages" in info.value.message
    assert responses_codec.responses_field("messages[0].content", ["instructions"]) == "instructions"
    assert responses_codec.responses_field("tools[2].function.parameters") == "tools[2].parameters"
    bad = [
        ("previous_response_id", "", "previous_response_id"),
        ("previous_response_id", 5, "previous_response_id"),
        ("store", "no", "store"),
        ("include", "x", "include"),
        ("metadata", ["a"], "metadata"),
        ("metadata", {str(i): "v" for i in range(17)}, "metadata"),
        ("metadata", {"k" * 65: "v"}, "metadata"),
        ("metadata", {"run": 5}, "metadata.run"),
        ("metadata", {"run": "v" * 513}, "metadata.run"),
    ]
    for field, value, named in bad:
        with pytest.raises(InvalidArgument) as info:
            responses_codec.decode_responses_request({"input": "q", field: value}, SETTINGS)
        assert info.value.field == named


def test_include_output_text_logprobs_asks_chat_for_the_sampled_tokens_logprobs():
    body = {"input": "q", "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}
    request = responses_codec.decode_responses_request(body, SETTINGS)
    assert request.chat.top_logprobs == 0
    assert responses_codec.decode_responses_request({"input": "q"}, SETTINGS).chat.top_logprobs is None
    choice = Choice(
        0, [5, 6], [-0.5, -1.5], [0, 0], "Hm", FinishReason.STOP, Message("assistant", "Hm"), ["H", "m"]
    )
    [item] = responses_codec.encode_response(Answer("resp_a", "chat", 0, "tools", [1], [choice]), request)[
        "output"
    ]
    logprobs = item["content"][0]["logprobs"]
    assert [(p["token"], p["logprob"], p["bytes"]) for p in logprobs] == [
        ("H", -0.5, [72]),
        ("m", -1.5, [109]),
    ]


def test_a_served_call_answers_as_a_response_object():
    call = FunctionCall("call_9", "calculator", '{"e": "1"}')
    choice = Choice(
        0, [5, 6], [-0.1, -0.2], [0, 0], "x", FinishReason.STOP, Message("assistant", "Hm.", (call,))
    )
    answer = Answer("resp_abc", "chat", 1700000000, "tools", [1, 2, 3], [choice])
    body = {
        "input": "q",
        "instructions": "Be brief.",
        "previous_response_id": "resp_0",
        "metadata": {"k" * 64: "v" * 512, "run": "7"},
    }
    request = responses_codec.decode_responses_request(body, SETTINGS)
    out = responses_codec.encode_response(answer, request)
    assert out["metadata"] == body["metadata"]
    assert out["object"] == "response" and out["id"] == "resp_abc" and out["status"] == "completed"
    assert (out["instructions"], out["previous_response_id"], out["store"]) == ("Be brief.", "resp_0", True)
    message, function_call = out["output"]
    assert message["type"] == "message" and message["content"][0] == {
        "type": "output_text",
        "text": "Hm.",
        "annotations": [],
        "logprobs": [],
    }
    assert (function_call["type"], function_call["call_id"], function_call["name"]) == (
        "function_call",
        "call_9",
        "calculator",
    )
    assert out["usage"]["input_tokens"] == 3 and out["usage"]["output_tokens"] == 2
    cut = Choice(0, [5], [-0.1], [0], "x", FinishReason.LENGTH, Message("assistant", "x"))
    out = responses_codec.encode_response(Answer("resp_b", "chat", 0, "tools", [1], [cut]), request)
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
