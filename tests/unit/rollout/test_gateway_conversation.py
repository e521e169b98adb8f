"""Prefix reuse and trajectory assembly of the gateway's sessions, on the tools policy's tokenizer with a
chat template that renders tool calls (Hermes/Qwen blocks inside the assistant turn) and tool results."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rollout_service.gateway.conversation import ConversationRenderer, tools_key
from rollout_service.gateway.sessions import CallRecord, SampledChoice, Session
from rollout_service.gateway.trajectory import trajectory
from rollout_service.gateway.types import FunctionCall, Message

TOOLS_MODEL = Path(__file__).resolve().parents[3] / "models" / "tools"
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Earlier assistant turns lose their text: a template whose rendering of a conversation's start changes
# when more follows (as templates that strip reasoning do).
REWRITING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role != 'assistant' or loop.last %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = ({"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}},)
QUESTION = Message("user", "What is 12 + 30?")


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(TOOLS_MODEL)
    tok.chat_template = TEMPLATE
    return tok


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def record(session: Session, renderer, messages, reply_ids_by_choice, replies, tools=TOOLS, version=0):
    """Plan the call's prompt as the gateway does and record it with the given sampled ids and replies."""
    plan = renderer.chat_prompt(session.calls, messages, tools)
    session.retokenized_tokens += plan.retokenized
    session.prefix_mismatches += plan.mismatch
    choices = [
        SampledChoice(ids, [-0.25] * len(ids), [version] * len(ids), reply.content, reply)
        for ids, reply in zip(reply_ids_by_choice, replies, strict=True)
    ]
    call = CallRecord(
        session.next_index,
        "chat",
        plan.prompt_ids,
        choices,
        version,
        plan.parent,
        plan.reused,
        tuple(messages),
        tools_key(tools),
        plan.rendered,
    )
    session.record(call)
    return call


def call_reply(arguments: str = '{"expression": "12 + 30"}') -> Message:
    return Message("assistant", "", (FunctionCall("call_1", "calculator", arguments),))


def test_a_tool_loop_reuses_the_sampled_ids_and_is_one_sequence(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    session = Session("s", 1e12, 100)
    eos = tokenizer.eos_token_id
    # The model wrote " answer" as two tokens (" ", "answer"): encoding its text again would merge them.
    first_ids = encode(
        tokenizer, '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 30"}}\n'
    )
    first_ids += [*encode(tokenizer, "</tool_call>"), eos]
    first = record(session, renderer, [QUESTION], [first_ids], [call_reply()], version=3)
    assert first.parent is None and first.prompt_ids == renderer.render(
        [QUESTION], TOOLS, add_generation_prompt=True
    )

    history = [QUESTION, call_reply(), Message("tool", "42", tool_call_id="call_1")]
    second_ids = [*encode(tokenizer, "The"), 224, 270, *encode(tokenizer, " is 42."), eos]
    assert tokenizer.decode([224, 270]) == " answer" and encode(tokenizer, " answer") != [224, 270]
    second = record(
        session, renderer, history, [second_ids], [Message("assistant", "The answer is 42.")], version=4
    )

    # The prompt is the first call's prompt + its sampled ids, then the template's ids of the tool message.
    assert second.parent == (0, 0)
    assert second.prompt_ids[: len(first.prompt_ids) + len(first_ids)] == first.prompt_ids + first_ids
    full = renderer.render(history, TOOLS, add_generation_prompt=True)
    upto_reply = renderer.render(history[:2], TOOLS, add_generation_prompt=False)
    cut = upto_reply[: max(i for i, t in enumerate(upto_reply) if t == eos) + 1]
    assert second.prompt_ids[len(first.prompt_ids) + len(first_ids) :] == full[len(cut) :]
    assert tokenizer.decode(full[len(cut) :]) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"

    third = [*history, Message("assistant", "The answer is 42."), Message("user", "Thanks")]
    record(session, renderer, third, [[eos]], [Message("assistant", "")], version=5)
    out = trajectory(session)
    assert out.calls == 3 and out.retokenized_tokens == 0 and out.prefix_mismatches == 0
    (sequence,) = out.sequences
    assert sequence.token_ids[: len(session.calls[1].prompt_ids)] == session.calls[1].prompt_ids
    sampled = [t for t, m in zip(sequence.token_ids, sequence.loss_mask, strict=True) if m]
    assert sampled == first_ids + second_ids + [eos]
    start2 = len(session.calls[1].prompt_ids)
    assert sequence.token_ids[start2 : start2 + len(second_ids)] == second_ids
    assert sequence.loss_mask[start2 : start2 + len(second_ids)] == [1] * len(second_ids)
    # Versions: each sampled token its call's; each fed token the version of the call that fed it.
    start1 = len(first.prompt_ids)
    assert sequence.policy_versions[:start1] == [3] * start1
    assert sequence.policy_versions[start1 + len(first_ids) : start2] == [4] * (
        start2 - start1 - len(first_ids)
    )
    assert sequence.policy_versions[start2 : start2 + len(second_ids)] == [4] * len(second_ids)
    assert sequence.policy_versions[-1] == 5
    assert all(
        lp == (-0.25 if m else 0.0) for lp, m in zip(sequence.logprobs, sequence.loss_mask, strict=True)
    )


def test_a_reply_cut_short_gets_the_closing_eos_unsampled(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    session = Session("s", 1e12, 100)
    cut_ids = encode(tokenizer, "Let me think")  # max_tokens reached: no EOS
    record(session, renderer, [QUESTION], [cut_ids], [Message("assistant", "Let me think")])
    follow = [QUESTION, Message("assistant", "Let me think"), Message("user", "Go on")]
    second = record(session, renderer, follow, [[tokenizer.eos_token_id]], [Message("assistant", "")])
    first = session.calls[0]
    at = len(first.prompt_ids) + len(cut_ids)
    assert second.parent == (0, 0) and second.prompt_ids[at] == tokenizer.eos_token_id
    (sequence,) = trajectory(session).sequences
    assert sequence.loss_mask[at] == 0 and sequence.loss_mask[at - len(cut_ids) : at] == [1] * len(cut_ids)


def test_samples_and_a_rewritten_history_are_branches(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    session = Session("s", 1e12, 100)
    eos = tokenizer.eos_token_id
    a, b = [*encode(tokenizer, "Yes"), eos], [*encode(tokenizer, "No"), eos]
    record(session, renderer, [QUESTION], [a, b], [Message("assistant", "Yes"), Message("assistant", "No")])
    # The agent continues sample 1; then it sends a history whose reply it edited (a new root).
    record(
        session,
        renderer,
        [QUESTION, Message("assistant", "No"), Message("user", "Sure?")],
        [[eos]],
        [Message("assistant", "")],
    )
    edited = record(
        session,
        renderer,
        [QUESTION, Message("assistant", "Maybe"), Message("user", "Sure?")],
        [[eos]],
        [Message("assistant", "")],
    )
    assert session.calls[1].parent == (0, 1) and edited.parent is None
    out = trajectory(session)
    assert len(out.sequences) == 3  # sample 0 alone; sample 1 continued; the edited history
    assert out.prefix_mismatches == 0 and out.retokenized_tokens == 0
    lone, continued, rewritten = out.sequences
    assert lone.token_ids == session.calls[0].prompt_ids + a
    assert continued.token_ids[: len(session.calls[0].prompt_ids) + len(b)] == session.calls[0].prompt_ids + b
    assert rewritten.token_ids == [*edited.prompt_ids, eos] and sum(rewritten.loss_mask) == 1


def test_a_template_that_rewrites_earlier_turns_is_a_counted_mismatch():
    tokenizer = AutoTokenizer.from_pretrained(TOOLS_MODEL)
    tokenizer.chat_template = REWRITING_TEMPLATE
    renderer = ConversationRenderer(tokenizer)
    session = Session("s", 1e12, 100)
    ids = [*encode(tokenizer, "Forty-two"), tokenizer.eos_token_id]
    record(session, renderer, [QUESTION], [ids], [Message("assistant", "Forty-two")], tools=())
    messages = [QUESTION, Message("assistant", "Forty-two"), Message("user", "Why?")]
    second = record(session, renderer, messages, [ids], [Message("assistant", "Forty-two")], tools=())
    assert second.parent is None
    assert second.prompt_ids == renderer.render(messages, (), add_generation_prompt=True)
    out = trajectory(session)
    assert out.prefix_mismatches == 1
    assert out.retokenized_tokens == len(session.calls[0].prompt_ids) + len(ids)
    assert len(out.sequences) == 2


def test_other_tools_do_not_extend(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    session = Session("s", 1e12, 100)
    ids = [*encode(tokenizer, "Hi"), tokenizer.eos_token_id]
    record(session, renderer, [QUESTION], [ids], [Message("assistant", "Hi")])
    later = record(
        session,
        renderer,
        [QUESTION, Message("assistant", "Hi"), Message("user", "?")],
        [ids],
        [Message("assistant", "Hi")],
        tools=(),
    )
    assert later.parent is None


def test_completion_prompts_extend_by_text_and_by_ids(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    session = Session("s", 1e12, 100)
    prompt = "Q: 12 + 30 ="
    plan = renderer.completion_prompt(session.calls, prompt)
    sampled = [224, 270]  # " answer", not as the tokenizer would write it
    session.record(
        CallRecord(
            0,
            "completion",
            plan.prompt_ids,
            [SampledChoice(sampled, [-1.0, -1.0], [0, 0], " answer")],
            0,
            prompt_text=prompt,
        )
    )
    by_text = renderer.completion_prompt(session.calls, prompt + " answer: 42")
    assert by_text.parent == (0, 0)
    assert by_text.prompt_ids == plan.prompt_ids + sampled + encode(tokenizer, ": 42")
    by_ids = renderer.completion_prompt(session.calls, tuple(plan.prompt_ids + sampled + [20]))
    assert by_ids.parent == (0, 0) and by_ids.reused == len(plan.prompt_ids) + 2
    assert renderer.completion_prompt(session.calls, "Q: 1 + 1 =").parent is None
