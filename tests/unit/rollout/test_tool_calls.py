"""Parsing tool calls from model text (the Hermes / Qwen format TRL parses) and tool-result tokens."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from grpo_runtime.env_types import ToolResult
from rollout_service.core.tool_calls import ToolSuffixer, parse_tool_calls


def test_calls_are_parsed_in_order_with_arguments_as_json_text():
    text = (
        'Let me compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call><|im_end|>'
    )
    parsed = parse_tool_calls(text)
    assert [(p.call.name, p.call.id, p.error) for p in parsed] == [
        ("calculator", "call_0", ""),
        ("python", "call_1", ""),
    ]
    assert json.loads(parsed[0].call.arguments_json) == {"expression": "2*3"}
    assert parsed[1].call.arguments_json == '{"code": "print(1)"}'  # a quoted object is sent as written


def test_no_call_and_an_unclosed_call_are_an_answer():
    assert parse_tool_calls("The answer is 42.") == []
    assert parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {}}') == []


def test_malformed_bodies_are_kept_as_errors():
    bad_json, no_name, not_object = parse_tool_calls(
        '<tool_call>{oops</tool_call><tool_call>{"arguments": {}}</tool_call><tool_call>[1, 2]</tool_call>'
    )
    assert "not valid JSON" in bad_json.error and bad_json.call.arguments_json == "{oops"
    assert "JSON object" in no_name.error and "JSON object" in not_object.error


def test_tool_suffix_is_the_tool_message_and_the_next_generation_prompt(tiny_models):
    tok = AutoTokenizer.from_pretrained(tiny_models["policy"])
    ids = ToolSuffixer(tok).suffix_ids([ToolResult("call_0", "calculator", "56088")])
    assert tok.decode(ids) == "\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n"
    assert ToolSuffixer(tok).suffix_ids([]) == []


def test_short_tool_suffixes_are_cached_and_equal_to_a_fresh_render(tiny_models):
    tok = AutoTokenizer.from_pretrained(tiny_models["policy"])
    suffixer = ToolSuffixer(tok)
    short = [ToolResult("call_0", "calculator", "56088")]
    long = [ToolResult("call_0", "calculator", "9" * (ToolSuffixer.CACHED_CHARS + 1))]
    for results in (short, short, long, long):
        assert suffixer.suffix_ids(results) == ToolSuffixer(tok).suffix_ids(results)
    assert suffixer._cached.cache_info().hits == 1 and suffixer._cached.cache_info().currsize == 1
