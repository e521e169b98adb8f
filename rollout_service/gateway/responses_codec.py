"""OpenAI's Responses API (``POST /v1/responses``) over the gateway's chat path, both directions.

A Responses request is read into the chat request it means, and served by the same token-exact sessions, so
an agent written with the OpenAI Agents SDK's default model (which speaks this API) trains as a chat one
does: a turn that sends back the previous turn's output items extends the recorded call.

- ``instructions``: a system message before the conversation;
- ``input``: a text (one user message), or items: a ``message`` item (``type`` may be left out; roles as in
  chat; text, or ``input_text`` / ``output_text`` parts) is a message; ``function_call`` items are the tool
  calls of the assistant message before them (or of an assistant message of their own), ``call_id`` each
  call's id; a ``function_call_output`` item is a tool message answering ``call_id``;
- ``tools`` (function tools, flat: ``name``, ``description``, ``parameters``) and ``tool_choice`` as chat's;
  ``max_output_tokens`` the call's ``max_tokens``; ``temperature``, ``top_p`` as chat's; ``include`` with
  ``message.output_text.logprobs``: chat's ``logprobs`` (the reply's sampled tokens, tool calls included, as
  chat gives them); its other values ask for what this server does not produce and change nothing;
  ``metadata`` (string pairs within OpenAI's bounds) is echoed.

The answer is a ``response`` object: the reply's text as a ``message`` item with one ``output_text`` part,
each tool call a ``function_call`` item (``call_id`` the id chat gives it); ``status`` "incomplete" with
reason ``max_output_tokens`` when the reply was cut there. With ``stream``, the same as the API's events
(:func:`response_events`).

- ``previous_response_id``: the input continues that response's conversation (:class:`ResponsesRequest`;
  the gateway keeps a session's responses unless ``store`` is false, and serves ``previous_response_id``
  only within the session that made it).

Refused by name rather than ignored: ``conversation`` (no conversation objects), ``background``,
``prompt``, a ``text.format`` other than text, ``top_logprobs``, and items, parts and tools of other kinds
(images, files, reasoning, built-in tools). Errors name the field as the caller wrote it, also for what the
chat reader checks (``input[2].content``, ``max_output_tokens``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from grpo_runtime.errors import InvalidArgument, ResourceExhausted, ServiceError
from rollout_service.gateway.openai_codec import (
    as_object,
    as_string,
    as_text,
    decode_chat_request,
    read_bool,
    token_logprobs,
    usage,
)
from rollout_service.gateway.types import Answer, ResponsesRequest
from rollout_service.settings import GatewaySettings
from rollout_service.types import FinishReason

# Set to anything but null (or false), these ask for what this server does not do.
_REFUSED = {
    "conversation": "this server keeps no conversation objects; send previous_response_id or the whole "
    "conversation as input",
    "background": "not supported by this server; leave it unset",
    "prompt": "stored prompts are not supported by this server; send instructions and input",
    "top_logprobs": "not supported on /v1/responses; leave it unset",
}
_CHAT_KEYS = ("stream", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop")
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_LOGPROBS = "message.output_text.logprobs"
MAX_INCLUDE = 16  # the API defines fewer values than this
# OpenAI's bounds on ``metadata``: key-value pairs, characters of a key, characters of a value.
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


@dataclass
class _Conversation:
    """Chat messages being built from Responses input, and for each the Responses field it came from."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    def add(self, message: dict[str, Any], origin: str) -> None:
        self.messages.append(message)
        self.origins.append(origin)


# -------------------------------------------------------------- request
def decode_responses_request(body: Any, settings: GatewaySettings) -> ResponsesRequest:
    """The chat request a Responses body means (module docstring); InvalidArgument naming the field."""
    body = as_object(body, "body")
    for key, reason in _REFUSED.items():
        if body.get(key) not in (None, False):
            raise InvalidArgument(reason, field=key)
    _check_text_format(body.get("text"))
    previous = body.get("previous_response_id")
    if previous is not None:
        as_string(previous, "previous_response_id", empty=False)
    store = body.get("store") is None or read_bool(body, "store")
    logprobs = _LOGPROBS in _include(body.get("include"))
    metadata = _metadata(body.get("metadata"))
    instructions = body.get("instructions")
    conversation = _conversation(instructions, body.get("input"), settings.max_messages)
    chat: dict[str, Any] = {
        "messages": conversation.messages,
        **{key: body[key] for key in _CHAT_KEYS if key in body},
    }
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if logprobs:
        chat["logprobs"] = True
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    try:
        request = decode_chat_request(chat, settings)
    except ServiceError as error:
        error.field = responses_field(error.field, conversation.origins)
        raise
    return ResponsesRequest(request, instructions, previous, store, metadata)


def _metadata(metadata: Any) -> dict[str, str]:
    """``metadata`` as OpenAI bounds it: at most 16 pairs of a string key (≤ 64 characters) and a string
    value (≤ 512 characters); checked before it is walked, echoed in the response."""
    if metadata is None:
        return {}
    metadata = as_object(metadata, "metadata")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidArgument(f"at most {MAX_METADATA_PAIRS} key-value pairs", field="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidArgument(f"a key is over {MAX_METADATA_KEY_CHARS} characters", field="metadata")
        if len(as_string(value, f"metadata.{key}")) > MAX_METADATA_VALUE_CHARS:
            raise InvalidArgument(f"is over {MAX_METADATA_VALUE_CHARS} characters", field=f"metadata.{key}")
    return dict(metadata)


def _include(include: Any) -> list[str]:
    if include is None:
        return []
    if not isinstance(include, list) or len(include) > MAX_INCLUDE:
        raise InvalidArgument(f"must be a list of at most {MAX_INCLUDE} strings", field="include")
    return [as_string(value, f"include[{i}]") for i, value in enumerate(include)]


def _check_text_format(text: Any) -> None:
    if text is None:
        return
    form = as_object(text, "text").get("format")
    if form is not None and (not isinstance(form, dict) or form.get("type") != "text"):
        raise InvalidArgument("only {'type': 'text'} is supported", field="text.format")


def _conversation(instructions: Any, items: Any, max_messages: int) -> _Conversation:
    """The chat messages of ``instructions`` and ``input``, refused as soon as they pass ``max_messages``
    (before the rest is read), as chat refuses a longer ``messages``."""
    conversation = _Conversation()
    if instructions is not None:
        conversation.add(
            {"role": "system", "content": as_string(instructions, "instructions")}, "instructions"
        )
    if isinstance(items, str):
        conversation.add({"role": "user", "content": items}, "input")
        return conversation
    if not isinstance(items, list) or not items:
        raise InvalidArgument("must be a text or a non-empty list of items", field="input")
    for i, item in enumerate(items):
        _add_item(conversation, item, f"input[{i}]")
        if len(conversation.messages) > max_messages:
            raise ResourceExhausted(
                f"more than the server's limit gateway.max_messages = {max_messages} messages (item {i})",
                field="input",
            )
    return conversation


def _add_item(conversation: _Conversation, item: Any, where: str) -> None:
    kind = as_object(item, where).get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _MESSAGE_ROLES:
            raise InvalidArgument(
                f"must be one of {sorted(_MESSAGE_ROLES)}, got {role!r:.40}", field=f"{where}.role"
            )
        conversation.add({"role": role, "content": _content(item.get("content"), f"{where}.content")}, where)
    elif kind == "function_call":
        call = {
            "id": as_string(item.get("call_id"), f"{where}.call_id", empty=False),
            "type": "function",
            "function": {
                "name": as_string(item.get("name"), f"{where}.name", empty=False),
                "arguments": as_string(item.get("arguments"), f"{where}.arguments"),
            },
        }
        last = conversation.messages[-1] if conversation.messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)  # the calls of the reply they follow
        else:
            conversation.add({"role": "assistant", "content": "", "tool_calls": [call]}, where)
    elif kind == "function_call_output":
        output = _content(item.get("output"), f"{where}.output")
        conversation.add(
            {
                "role": "tool",
                "tool_call_id": as_string(item.get("call_id"), f"{where}.call_id", empty=False),
                "content": output,
            },
            where,
        )
    else:
        raise InvalidArgument(
            f"only message, function_call and function_call_output items are supported, got {kind!r:.40}",
            field=f"{where}.type",
        )


def _content(value: Any, where: str) -> str:
    """A text, or text parts joined (chat's reader with the Responses part types; unlike chat, never null)."""
    if value is None:
        raise InvalidArgument("must be a string or a list of parts, got null", field=where)
    return as_text(value, where, _TEXT_PARTS)


def _tools(tools: Any) -> Any:
    """Flat function tools as chat's nested ones; the chat reader checks each (its errors renamed back)."""
    if not isinstance(tools, list):
        return tools  # the chat reader names the type
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidArgument("only 'function' tools are supported", field=f"tools[{i}].type")
        function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


# Chat fields as the Responses request names them.
_RENAMES = (
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"^tool_choice\.function\."), "tool_choice."),
)
_MESSAGE_FIELD = re.compile(r"^messages\[(\d+)\](.*)$")


def responses_field(name: str | None, origins: list[str] | None = None) -> str | None:
    """A chat field (or a core field the HTTP layer already renamed for chat) as the Responses request's:
    ``messages[k]...`` → the input item (or ``instructions``) message k came from (``origins``), else
    ``input``; ``max_tokens`` → ``max_output_tokens``; ``tools[i].function.name`` → ``tools[i].name``."""
    if not name:
        return name
    matched = _MESSAGE_FIELD.match(name)
    if matched:
        index, rest = int(matched.group(1)), matched.group(2)
        if origins is not None and index < len(origins):
            origin = origins[index]
            return origin + rest if origin.startswith("input[") else origin
        return "input"
    if name == "messages":
        return "input"
    for pattern, replacement in _RENAMES:
        renamed, count = pattern.subn(replacement, name, count=1)
        if count:
            return renamed
    return name


# -------------------------------------------------------------- answer
def _choice_json(choice: str) -> Any:
    return choice if choice in ("none", "auto", "required") else {"type": "function", "name": choice}


def encode_response(answer: Answer, request: ResponsesRequest) -> dict[str, Any]:
    """The ``response`` object of a served call (one choice; ``answer.id`` the response's id)."""
    [choice] = answer.choices
    assert choice.message is not None
    output: list[dict[str, Any]] = []
    if choice.message.content or not choice.message.tool_calls:
        logprobs = token_logprobs(choice) or []
        part = {
            "type": "output_text",
            "text": choice.message.content,
            "annotations": [],
            "logprobs": logprobs,
        }
        output.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for call in choice.message.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    cut = choice.finish_reason == FinishReason.LENGTH and not choice.message.tool_calls
    counts = usage(answer)
    chat = request.chat
    return {
        "id": answer.id,
        "object": "response",
        "created_at": answer.created,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": answer.model,
        "output": output,
        "instructions": request.instructions,
        "max_output_tokens": chat.sampling.max_tokens,
        "temperature": chat.sampling.spec.temperature,
        "top_p": chat.sampling.spec.top_p,
        "tools": [{"type": "function", **tool["function"]} for tool in chat.tools],
        "tool_choice": _choice_json(chat.tool_choice),
        "parallel_tool_calls": True,
        "previous_response_id": request.previous_response_id,
        "reasoning": None,
        "store": request.store,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": request.metadata,
        "usage": {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        },
    }


def response_events(answer: Answer, request: ResponsesRequest) -> Iterator[dict[str, Any]]:
    """The answer as the Responses API's stream events, numbered by ``sequence_number``:
    ``response.created`` and ``response.in_progress`` (no output yet); per output item its ``added``, its
    text or arguments as one delta and ``done`` events, then ``output_item.done``; last
    ``response.completed`` (or ``response.incomplete``) with the whole response. Generation is finished when
    streaming starts (the engines return a batch's completions whole), so each delta is the whole text."""
    final = encode_response(answer, request)
    started = {**final, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    events = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(final["output"]):
        events += _item_events(index, item)
    ended = "response.completed" if final["status"] == "completed" else "response.incomplete"
    events.append({"type": ended, "response": final})
    for number, event in enumerate(events):
        yield {**event, "sequence_number": number}


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        return [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
            {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            },
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    [part] = item["content"]
    at["content_index"] = 0
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "content": [], "status": "in_progress"},
        },
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **at, "delta": part["text"], "logprobs": part["logprobs"]},
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": part["logprobs"]},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
