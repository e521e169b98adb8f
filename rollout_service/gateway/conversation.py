"""Prompts of a session's calls, reusing the exact ids of the calls they extend (token-in, token-out).

The rule. A chat call *extends* an earlier call C of its session, choice k, when its tools are C's, its
first messages are C's messages as sent, and the next one is C's reply k as the agent got it (same text,
same calls). Then its prompt is C's prompt ids + the ids C sampled for k — never decoded and encoded again
— followed by the ids of the messages after the reply, taken from the chat template: the whole conversation
is rendered, and the ids after the rendering of the conversation up to the reply (cut after its last EOS,
where the model's turn ended) are appended. When the sampled ids did not end with that EOS (the reply hit
``max_tokens`` or a stop string), the EOS is added, unsampled, as the template would close the turn.

That holds only if the template renders a conversation's start the same whatever follows: the rendering of
C's messages must be a prefix of the rendering up to the reply, and that of the whole conversation. When it
is not (templates that rewrite earlier turns), the call is a *prefix mismatch*: its prompt is the template's
rendering of the whole conversation, C's recorded ids are counted as ``retokenized`` and the call starts a
new branch. Of several calls it extends, the one with the most messages (then the latest) is taken. A call
that extends none (the first, a rewritten history, a sub-agent's own conversation) is rendered whole and
starts a new branch; nothing was reused, so nothing is counted.

Completions follow the same rule on their prompts: a text prompt that starts with C's prompt text + the text
of choice k, or a token-id prompt that starts with C's prompt ids + sampled ids, reuses those ids; the
remaining text is tokenized alone (no special tokens added).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.tokenizing import chat_token_ids
from rollout_service.gateway.sessions import CallRecord
from rollout_service.gateway.types import Message


@dataclass(frozen=True)
class PromptPlan:
    """A call's prompt ids and where they came from: ``parent`` (call index, choice) whose prompt + sampled
    ids are the first ``reused`` ids, or None; ``rendered``: the template's ids of the call's own messages
    (chat; what a later call compares against); ``retokenized`` / ``mismatch``: a prefix mismatch's count."""

    prompt_ids: list[int]
    parent: tuple[int, int] | None = None
    reused: int = 0
    rendered: tuple[int, ...] = ()
    retokenized: int = 0
    mismatch: bool = False


def tools_key(tools: Sequence[dict[str, Any]]) -> str:
    """A canonical text of a call's tool definitions: calls extend each other only under the same tools."""
    return json.dumps(list(tools), sort_keys=True, separators=(",", ":"))


class ConversationRenderer:
    """Chat-template rendering and prefix reuse over one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token_id

    def render(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, add_generation_prompt: bool
    ) -> list[int]:
        """The chat template's ids for ``messages``; InvalidArgument naming ``messages`` when it refuses
        them (roles out of order, a field it needs missing)."""
        if self.tokenizer.chat_template is None:
            raise InvalidArgument("this model has no chat template; use /v1/completions", field="messages")
        try:
            ids = chat_token_ids(
                self.tokenizer,
                [m.template_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) or None,
            )
        except (jinja2.TemplateError, TypeError, KeyError, ValueError) as exc:
            raise InvalidArgument(f"the chat template refused them: {exc}", field="messages") from exc
        return ids

    # ------------------------------------------------------------------ chat
    def chat_prompt(
        self, calls: Sequence[CallRecord], messages: Sequence[Message], tools: Sequence[dict[str, Any]]
    ) -> PromptPlan:
        key = tools_key(tools)
        full = self.render(messages, tools, add_generation_prompt=True)
        rendered = tuple(full)
        found = _extended_chat_call(calls, messages, key)
        if found is None:
            return PromptPlan(full, rendered=rendered)
        call, k = found
        sampled = call.choices[k].token_ids
        upto_reply = self.render(messages[: len(call.messages) + 1], tools, add_generation_prompt=False)
        closed = self._cut_after_last_eos(upto_reply)
        earlier = list(call.rendered_ids)
        stable = closed[: len(earlier)] == earlier and full[: len(closed)] == closed
        if not stable:
            return PromptPlan(
                full, rendered=rendered, retokenized=len(call.prompt_ids) + len(sampled), mismatch=True
            )
        reused = call.prompt_ids + sampled
        closing = [self.eos] if closed and closed[-1] == self.eos and sampled[-1:] != [self.eos] else []
        return PromptPlan(
            reused + closing + full[len(closed) :],
            parent=(call.index, k),
            reused=len(reused),
            rendered=rendered,
        )

    def _cut_after_last_eos(self, ids: list[int]) -> list[int]:
        """Templates end a turn with EOS and more (a newline): the model's turn ended at the EOS."""
        ends = [i for i, t in enumerate(ids) if t == self.eos]
        return ids[: ends[-1] + 1] if ends else ids

    # ------------------------------------------------------------ completion
    def completion_prompt(self, calls: Sequence[CallRecord], prompt: str | tuple[int, ...]) -> PromptPlan:
        best: tuple[int, list[int], int, int] | None = None  # (length matched, reused ids, call, choice)
        for call in calls:
            if call.kind != "completion":
                continue
            for k, choice in enumerate(call.choices):
                ids = call.prompt_ids + choice.token_ids
                if isinstance(prompt, str):
                    known = call.prompt_text + choice.text
                    matched = bool(call.prompt_text) and prompt.startswith(known)
                    length = len(known)
                else:
                    matched = list(prompt[: len(ids)]) == ids
                    length = len(ids)
                if matched and (best is None or length >= best[0]):
                    best = (length, ids, call.index, k)
        if best is None:
            ids = list(self.tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else list(prompt)
            return PromptPlan(ids)
        length, reused, index, k = best
        if isinstance(prompt, str):
            rest = prompt[length:]
            tail = list(self.tokenizer(rest, add_special_tokens=False)["input_ids"]) if rest else []
        else:
            tail = list(prompt[length:])
        return PromptPlan(reused + tail, parent=(index, k), reused=len(reused))


def _extended_chat_call(
    calls: Sequence[CallRecord], messages: Sequence[Message], key: str
) -> tuple[CallRecord, int] | None:
    """The call (and choice) whose conversation + reply ``messages`` continue: most messages, then latest."""
    best: tuple[CallRecord, int] | None = None
    for call in calls:
        j = len(call.messages)
        if call.kind != "chat" or call.tools_key != key or j >= len(messages):
            continue
        if tuple(messages[:j]) != call.messages:
            continue
        for k, choice in enumerate(call.choices):
            if choice.reply is not None and choice.reply.same_reply(messages[j]):
                if best is None or j >= len(best[0].messages):
                    best = (call, k)
                break
    return best
