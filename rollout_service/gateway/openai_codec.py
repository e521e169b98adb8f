"""OpenAI JSON ↔ the gateway's domain types, both directions, shaped as vLLM's OpenAI server answers.

Requests are read strictly: a value of the wrong type or out of range is InvalidArgument naming the field as
the caller wrote it (``messages[2].content``, ``tools[0].function.parameters``, ``n``, ``max_tokens``); a
count over one of the gateway's limits is ResourceExhausted naming the limit (``gateway.max_messages``).
Fields this server cannot honour are refused by name rather than ignored (``top_logprobs`` > 0: the engines
report the sampled token's logprob only; penalties, ``logit_bias``, ``response_format``, ``echo``,
``suffix``); fields that change nothing here (``user``, ``metadata``, ``store``, ``parallel_tool_calls``,
``model``'s value) are accepted. vLLM's extras ``top_k``, ``min_p``, ``repetition_penalty`` and
``return_token_ids`` (the answer then carries ``prompt_token_ids`` and each choice's ``token_ids``) work
as there.

Answers: ``chat.completion`` / ``text_completion`` objects with ``usage``; logprobs as OpenAI's
``{content: [{token, logprob, bytes, top_logprobs: []}]}`` (chat) or ``{tokens, token_logprobs,
top_logprobs, text_offset}`` (completions); streams as ``chat.completion.chunk`` / ``text_completion``
chunks (:func:`chunks_of`), which the HTTP layer sends as server-sent events ending with ``[DONE]``.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from grpo_runtime.errors import InvalidArgument, ResourceExhausted
from grpo_runtime.struct_codec import MAX_STRUCT_DEPTH
from rollout_service.gateway.types import (
    Answer,
    ChatRequest,
    Choice,
    CompletionRequest,
    FunctionCall,
    Message,
    Sampling,
)
from rollout_service.settings import GatewaySettings
from rollout_service.types import FinishReason, SamplingSpec

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOP_LOGPROBS = 20
# Tool schemas up to this size (canonical JSON characters) have their check remembered: agents send the same
# tools on every call, and checking a schema against its meta-schema costs more than the rest of a request.
SCHEMA_MEMO_MAX_CHARS = 4096
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Refused unless neutral: the engines have no such knob.
_UNSUPPORTED_IF_SET = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
}


# ------------------------------------------------------------------ readers
# as_object, kind_of, read_bool, as_string and as_text are the readers the Responses API's codec shares.
def as_object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"must be an object, got {kind_of(value)}", field=field)
    return value


def kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _int(body: dict[str, Any], key: str, low: int, high: int | None = None, *, limit: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"must be an integer, got {kind_of(value)}", field=key)
    if value < low:
        raise InvalidArgument(f"must be >= {low}, got {value}", field=key)
    if high is not None and value > high:
        where = f" (the server's limit {limit})" if limit else ""
        raise InvalidArgument(f"must be <= {high}{where}, got {value}", field=key)
    return value


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"must be a finite number, got {value!r:.40}", field=key)
    return float(value)


def read_bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgument(f"must be a boolean, got {kind_of(value)}", field=key)
    return value


def as_string(value: Any, field: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise InvalidArgument(
            f"must be a {'' if empty else 'non-empty '}string, got {kind_of(value)}", field=field
        )
    return value


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for key, neutral in _UNSUPPORTED_IF_SET.items():
        value = body.get(key)
        if value is not None and value != neutral and value != {}:
            raise InvalidArgument("not supported by this server; leave it unset", field=key)
    response_format = body.get("response_format")
    if response_format is not None and as_object(response_format, "response_format").get("type") != "text":
        raise InvalidArgument("only {'type': 'text'} is supported", field="response_format.type")


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, list):
        raise InvalidArgument(f"must be a string or a list of strings, got {kind_of(stop)}", field="stop")
    return tuple(as_string(s, f"stop[{i}]") for i, s in enumerate(stop))


def _sampling(body: dict[str, Any], settings: GatewaySettings, default_max_tokens: int | None) -> Sampling:
    """OpenAI's sampling fields (and vLLM's extras) as the engine's spec; ranges are checked by the core's
    validator, whose errors the HTTP layer renames to these fields (:func:`openai_field`)."""
    _refuse_unsupported(body)
    max_tokens = _int(body, "max_completion_tokens", 1, settings.max_tokens, limit="gateway.max_tokens")
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1, settings.max_tokens, limit="gateway.max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    seed = _int(body, "seed", -(2**63))
    if seed is not None and seed < 0:
        seed &= (1 << 63) - 1  # OpenAI allows negative seeds; the engines take 63 bits
    spec = SamplingSpec(
        temperature=_default(_number(body, "temperature"), 1.0),
        top_p=_default(_number(body, "top_p"), 1.0),
        top_k=_default(_int(body, "top_k", -1), 0),
        min_p=_default(_number(body, "min_p"), 0.0),
        max_tokens=max_tokens or 1,
        stop=_stop(body),
        seed=seed,
        repetition_penalty=_default(_number(body, "repetition_penalty"), 1.0),
    )
    return Sampling(spec, max_tokens)


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


# -------------------------------------------------------------- chat request
def decode_chat_request(body: Any, settings: GatewaySettings) -> ChatRequest:
    body = as_object(body, "body")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("must be a non-empty list of messages", field="messages")
    if len(messages) > settings.max_messages:
        raise ResourceExhausted(
            f"{len(messages)} messages, more than the server's limit gateway.max_messages = "
            f"{settings.max_messages}",
            field="messages",
        )
    tools = _tools(body.get("tools"), settings)
    top_logprobs = _top_logprobs(body)
    stream_options = body.get("stream_options")
    include_usage = bool(stream_options) and read_bool(
        as_object(stream_options, "stream_options"), "include_usage"
    )
    return ChatRequest(
        messages=tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages)),
        sampling=_sampling(body, settings, None),
        n=_int(body, "n", 1, settings.max_n, limit="gateway.max_n") or 1,
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        top_logprobs=top_logprobs,
        stream=read_bool(body, "stream"),
        include_usage=include_usage,
        return_token_ids=read_bool(body, "return_token_ids"),
    )


def _top_logprobs(body: dict[str, Any]) -> int | None:
    """None without logprobs; else 0 (the only count the engines can give)."""
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if not read_bool(body, "logprobs"):
        if top:
            raise InvalidArgument("needs logprobs: true", field="top_logprobs")
        return None
    if top:
        raise InvalidArgument(
            "this server's engines report the sampled token's logprob only, not the most likely "
            "alternatives; set 0 or leave it unset",
            field="top_logprobs",
        )
    return 0


def _message(value: Any, field: str) -> Message:
    message = as_object(value, field)
    role = message.get("role")
    if role not in ROLES:
        raise InvalidArgument(f"must be one of {sorted(ROLES)}, got {role!r:.40}", field=f"{field}.role")
    calls = message.get("tool_calls") or []
    if calls and role != "assistant":
        raise InvalidArgument("only assistant messages carry tool calls", field=f"{field}.tool_calls")
    if not isinstance(calls, list):
        raise InvalidArgument(f"must be a list, got {kind_of(calls)}", field=f"{field}.tool_calls")
    tool_call_id = message.get("tool_call_id") or ""
    name = message.get("name") or ""
    return Message(
        role="system" if role == "developer" else role,
        content=as_text(message.get("content"), f"{field}.content"),
        tool_calls=tuple(_call(c, f"{field}.tool_calls[{j}]") for j, c in enumerate(calls)),
        tool_call_id=as_string(tool_call_id, f"{field}.tool_call_id"),
        name=as_string(name, f"{field}.name"),
    )


def as_text(value: Any, field: str, part_types: frozenset[str] = frozenset({"text"})) -> str:
    """Text, null, or a list of text parts (``type`` one of ``part_types``; joined); other parts (images,
    audio) are refused."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidArgument(f"must be a string or a list of parts, got {kind_of(value)}", field=field)
    texts = []
    for j, part in enumerate(value):
        part = as_object(part, f"{field}[{j}]")
        if part.get("type") not in part_types:
            raise InvalidArgument(
                f"only text parts are supported, got {part.get('type')!r:.40}", field=f"{field}[{j}].type"
            )
        texts.append(as_string(part.get("text"), f"{field}[{j}].text"))
    return "".join(texts)


def _call(value: Any, field: str) -> FunctionCall:
    call = as_object(value, field)
    if call.get("type", "function") != "function":
        raise InvalidArgument("must be 'function'", field=f"{field}.type")
    function = as_object(call.get("function"), f"{field}.function")
    return FunctionCall(
        id=as_string(call.get("id", ""), f"{field}.id"),
        name=as_string(function.get("name"), f"{field}.function.name", empty=False),
        arguments=as_string(function.get("arguments", "{}"), f"{field}.function.arguments"),
    )


def _tools(value: Any, settings: GatewaySettings) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidArgument(f"must be a list of tools, got {kind_of(value)}", field="tools")
    if len(value) > settings.max_tools:
        raise ResourceExhausted(
            f"{len(value)} tools, more than the server's limit gateway.max_tools = {settings.max_tools}",
            field="tools",
        )
    tools = tuple(_tool(tool, f"tools[{i}]") for i, tool in enumerate(value))
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in seen:  # a call names its tool: two of one name could not be told apart
            raise InvalidArgument(
                f"{name!r} is also the name of tools[{seen[name]}]", field=f"tools[{i}].function.name"
            )
        seen[name] = i
    return tools


def _tool(value: Any, field: str) -> dict[str, Any]:
    """A function tool, its parameters a valid JSON Schema (object) — what the chat template renders."""
    tool = as_object(value, field)
    if tool.get("type") != "function":
        raise InvalidArgument("only 'function' tools are supported", field=f"{field}.type")
    function = as_object(tool.get("function"), f"{field}.function")
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise InvalidArgument(
            "must be 1 to 64 letters, digits, underscores or dashes", field=f"{field}.function.name"
        )
    description = as_string(function.get("description", ""), f"{field}.function.description")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    where = f"{field}.function.parameters"
    # The schema check, the canonical text and the chat template each recurse once per level.
    if _deeper_than(as_object(parameters, where), MAX_STRUCT_DEPTH):
        raise InvalidArgument(
            f"nested deeper than {MAX_STRUCT_DEPTH} levels of objects and lists", field=where
        )
    error = _schema_error(parameters)
    if error is not None:
        raise InvalidArgument(f"not a valid JSON Schema: {error:.200}", field=where)
    out: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        out["description"] = description
    return {"type": "function", "function": out}


def _schema_error(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (checked against its draft's meta-schema), or None."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    if len(text) <= SCHEMA_MEMO_MAX_CHARS:
        return _memo_schema_error(text)
    return _check_schema(schema)


@functools.lru_cache(maxsize=256)
def _memo_schema_error(text: str) -> str | None:
    return _check_schema(json.loads(text))


def _check_schema(schema: dict[str, Any]) -> str | None:
    if not isinstance(schema.get("$schema", ""), str):  # jsonschema looks it up as a URI
        return f"$schema must be a string, got {kind_of(schema['$schema'])}"
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return str(exc.message)
    return None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and lists more than ``limit`` levels; walked without recursion."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> str:
    if value is None:
        return "auto"
    if value == "required" and not tools:
        raise InvalidArgument("is 'required' but the request has no tools", field="tool_choice")
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        name = as_object(value.get("function"), "tool_choice.function").get("name")
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise InvalidArgument(
                f"names no tool of the request: {name!r:.40}", field="tool_choice.function.name"
            )
        return name
    raise InvalidArgument("must be 'none', 'auto', 'required' or a function", field="tool_choice")


# -------------------------------------------------------- completion request
def decode_completion_request(body: Any, settings: GatewaySettings) -> CompletionRequest:
    body = as_object(body, "body")
    for key in ("echo", "suffix"):
        if body.get(key):
            raise InvalidArgument("not supported by this server; leave it unset", field=key)
    n = _int(body, "n", 1, settings.max_n, limit="gateway.max_n") or 1
    best_of = _int(body, "best_of", 1)
    if best_of is not None and best_of != n:
        raise InvalidArgument("must equal n (every sample is returned)", field="best_of")
    logprobs = _int(body, "logprobs", 0, 5)
    if logprobs:
        raise InvalidArgument(
            "this server's engines report the sampled token's logprob only; set 0", field="logprobs"
        )
    stream_options = body.get("stream_options")
    include_usage = bool(stream_options) and read_bool(
        as_object(stream_options, "stream_options"), "include_usage"
    )
    return CompletionRequest(
        prompt=_prompt(body.get("prompt")),
        sampling=_sampling(body, settings, COMPLETIONS_DEFAULT_MAX_TOKENS),
        n=n,
        logprobs=logprobs,
        stream=read_bool(body, "stream"),
        include_usage=include_usage,
        return_token_ids=read_bool(body, "return_token_ids"),
    )


def _prompt(value: Any) -> str | tuple[int, ...]:
    """A text or a list of token ids; a list holding one of those is that prompt (one prompt per call)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str) and value:
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        return tuple(value)
    raise InvalidArgument(
        "must be one non-empty text or one non-empty list of token ids (one prompt per request)",
        field="prompt",
    )


# ------------------------------------------------------------------- answers
def finish_reason(choice: Choice) -> str:
    """ "tool_calls" when the reply carries calls, "length" at ``max_tokens``, else "stop" (EOS, a stop
    string)."""
    if choice.message is not None and choice.message.tool_calls:
        return "tool_calls"
    return "length" if choice.finish_reason == FinishReason.LENGTH else "stop"


def usage(answer: Answer) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in answer.choices)
    prompt = len(answer.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _tool_calls(message: Message) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in message.tool_calls
    ]


def token_logprobs(choice: Choice) -> list[dict[str, Any]] | None:
    """Each sampled token's ``{token, logprob, bytes, top_logprobs}`` (None: logprobs were not asked for)."""
    if choice.tokens is None:
        return None
    return [
        {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
        for token, logprob in zip(choice.tokens, choice.logprobs, strict=True)
    ]


def _chat_logprobs(choice: Choice) -> dict[str, Any] | None:
    content = token_logprobs(choice)
    return None if content is None else {"content": content}


def _completion_logprobs(choice: Choice) -> dict[str, Any] | None:
    if choice.tokens is None:
        return None
    offsets, at = [], 0
    for token in choice.tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": choice.tokens,
        "token_logprobs": choice.logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(choice.tokens, choice.logprobs, strict=True)],
        "text_offset": offsets,
    }


def _message_json(message: Message) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": message.content or (None if message.tool_calls else ""),
        "tool_calls": _tool_calls(message),
    }


def encode_answer(answer: Answer, *, return_token_ids: bool = False) -> dict[str, Any]:
    choices = []
    for c in answer.choices:
        if answer.kind == "chat":
            assert c.message is not None
            item = {"index": c.index, "message": _message_json(c.message), "logprobs": _chat_logprobs(c)}
        else:
            item = {"index": c.index, "text": c.text, "logprobs": _completion_logprobs(c)}
        item.update(finish_reason=finish_reason(c), stop_reason=None)
        if return_token_ids:
            item["token_ids"] = c.token_ids
            if answer.kind == "completion":
                item["prompt_token_ids"] = answer.prompt_ids
        choices.append(item)
    out: dict[str, Any] = {
        "id": answer.id,
        "object": "chat.completion" if answer.kind == "chat" else "text_completion",
        "created": answer.created,
        "model": answer.model,
        "choices": choices,
        "usage": usage(answer),
    }
    if return_token_ids and answer.kind == "chat":
        out["prompt_token_ids"] = answer.prompt_ids
    return out


def chunks_of(
    answer: Answer, *, include_usage: bool = False, return_token_ids: bool = False
) -> Iterator[dict]:
    """The answer as a stream's chunks. Generation is finished when streaming starts (the engines return a
    batch's completions whole), so each choice comes as its role, its content (and logprobs), its tool calls
    and its finish reason; then, when asked, a last chunk with ``usage`` and no choices."""
    chat = answer.kind == "chat"
    head = {
        "id": answer.id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": answer.created,
        "model": answer.model,
    }

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        return {**head, "choices": [choice]}

    for c in answer.choices:
        extra = {"token_ids": c.token_ids} if return_token_ids else {}
        if not chat:
            yield chunk({"index": c.index, "text": c.text, "logprobs": _completion_logprobs(c), **extra})
            yield chunk({"index": c.index, "text": "", "logprobs": None, "finish_reason": finish_reason(c)})
            continue
        assert c.message is not None
        yield chunk({"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None})
        if c.message.content or c.tokens:
            delta = {"content": c.message.content}
            yield chunk({"index": c.index, "delta": delta, "logprobs": _chat_logprobs(c), **extra})
        if c.message.tool_calls:
            calls = [{"index": j, **call} for j, call in enumerate(_tool_calls(c.message))]
            yield chunk({"index": c.index, "delta": {"tool_calls": calls}, "logprobs": None})
        yield chunk({"index": c.index, "delta": {}, "logprobs": None, "finish_reason": finish_reason(c)})
    if include_usage:
        yield {**head, "choices": [], "usage": usage(answer)}


def encode_models(model: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "grpo-services",
                "root": model,
                "parent": None,
                "max_model_len": max_model_len,
            }
        ],
    }


# -------------------------------------------------------------------- errors
# The core names the fields of a Generate request; the gateway's caller wrote these.
_CORE_FIELDS = (
    (re.compile(r"^sampling\.max_tokens$"), "max_tokens"),
    (re.compile(r"^sampling\."), ""),
    (re.compile(r"^prompts(\[\d+\])?.*$"), "{prompt}"),
)


def openai_field(field: str | None, prompt_field: str) -> str | None:
    """A core field name as the OpenAI request's (``sampling.top_p`` → ``top_p``; a prompt's → ``messages``
    or ``prompt``); others as they are."""
    if not field:
        return None
    for pattern, replacement in _CORE_FIELDS:
        renamed, count = pattern.subn(replacement, field, count=1)
        if count:
            return renamed.replace("{prompt}", prompt_field)
    return field


def error_body(message: str, kind: str, param: str | None, code: str | int | None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message[:1000], "type": kind, "param": param, "code": code}}
