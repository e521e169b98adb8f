"""Tool calls in the model's text, and tool results as chat-template tokens.

Parsing follows the Hermes / Qwen convention that TRL's ``parse_response`` reads (its response schemas'
``x-regex-iterator`` ``<tool_call>\\s*(.+?)\\s*</tool_call>``): each call is a JSON object
``{"name": ..., "arguments": {...}}`` between the tags. Unlike TRL, which then treats the whole turn as
plain text, a call whose body is not such an object is kept as a *malformed* call: the model sees an
error result for it (the call is data, never a crash).

Tool results are tokenized as TRL's ``_get_tool_suffix_ids`` does: the chat template is rendered for a
dummy conversation with and without the tool messages, and the suffix after the dummy's last EOS is the
tokens to append (tool messages + the next generation prompt). The model's own tokens are never
re-tokenized.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from grpo_runtime.env_types import ToolCall, ToolResult
from grpo_runtime.tokenizing import chat_token_ids

TOOL_CALL = re.compile(r"<tool_call>\s*(.+?)\s*</tool_call>", re.DOTALL)
# A body cut off before its closing tag (turn stopped on EOS or the token budget) is not a call.


@dataclass(frozen=True)
class ParsedCall:
    """One ``<tool_call>`` block: a call to send, or (``error`` set) why its body is not a call."""

    call: ToolCall
    error: str = ""


def parse_tool_calls(text: str) -> list[ParsedCall]:
    """Every complete ``<tool_call>`` block of one turn's decoded text, in order.

    ``arguments`` given as an object is sent as its JSON text; given as a string (some models quote the
    object) it is sent as is, and the environment judges it.
    """
    calls = []
    for index, match in enumerate(TOOL_CALL.finditer(text)):
        body = match.group(1)
        call_id = f"call_{index}"
        try:
            value = json.loads(body)
        except ValueError as exc:
            calls.append(ParsedCall(ToolCall("", body, call_id), f"the tool call is not valid JSON: {exc}"))
            continue
        name = value.get("name") if isinstance(value, dict) else None
        if not isinstance(name, str) or not name:
            calls.append(
                ParsedCall(
                    ToolCall("", body, call_id),
                    'a tool call must be a JSON object {"name": "...", "arguments": {...}}',
                )
            )
            continue
        arguments = value.get("arguments", {})
        arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append(ParsedCall(ToolCall(name, arguments_json, call_id)))
    return calls


def malformed_result(parsed: ParsedCall) -> ToolResult:
    """The error result the model sees for a block that is not a call."""
    return ToolResult(parsed.call.id, parsed.call.name, f"error: {parsed.error}", error=True)


class ToolSuffixer:
    """Token ids of tool results in the model's chat template, to append after a turn.

    The ids depend only on the results' names and contents: short results (a number, a short error) are
    cached, the G episodes of a prompt often getting the same one, and so is the rendered conversation
    before them, per tool name.
    """

    CACHED_CHARS = 1024  # results up to this many characters in all are cached (at most 4096 of them)

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._cached = functools.lru_cache(maxsize=4096)(self._suffix)
        self._prefix = functools.lru_cache(maxsize=64)(self._render_prefix)

    def suffix_ids(self, results: list[ToolResult]) -> list[int]:
        """Tool messages + the generation prompt of the next assistant turn, as the template renders them
        after an assistant turn that ended on EOS (``[]`` when ``results`` is empty)."""
        if not results:
            return []
        key = tuple((r.name, r.content) for r in results)
        if sum(len(content) for _, content in key) <= self.CACHED_CHARS:
            return list(self._cached(key))
        return list(self._suffix(key))

    def _suffix(self, results: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
        first = results[0][0] or "tool"
        prefix = self._prefix(first)
        tools = [{"role": "tool", "name": name, "content": content} for name, content in results]
        full = self._render(self._dummy(first) + tools, add_generation_prompt=True)
        if full[: len(prefix)] != list(prefix):
            raise ValueError(
                "the chat template does not render tool messages as a suffix of the conversation"
            )
        return tuple(full[len(prefix) :])

    @staticmethod
    def _dummy(name: str) -> list[dict[str, Any]]:
        calls = [{"type": "function", "function": {"name": name, "arguments": {}}}]
        return [
            {"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", "tool_calls": calls},
        ]

    def _render_prefix(self, name: str) -> tuple[int, ...]:
        prefix = self._render(self._dummy(name), add_generation_prompt=False)
        # Templates that end a turn with EOS + newline: the model's turn ended at EOS, so cut there.
        eos = self.tokenizer.eos_token_id
        ends = [i for i, t in enumerate(prefix) if t == eos]
        return tuple(prefix[: ends[-1] + 1] if ends else prefix)

    def _render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> list[int]:
        return chat_token_ids(self.tokenizer, messages, add_generation_prompt=add_generation_prompt)
