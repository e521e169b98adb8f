"""Domain types of the gateway: requests as the codec hands them to the service, what the service answers,
and a session's trajectory. Plain data; the OpenAI JSON shapes are :mod:`openai_codec`'s."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rollout_service.types import FinishReason, SamplingSpec


@dataclass(frozen=True)
class FunctionCall:
    """One tool call of an assistant message; ``arguments`` is a JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    """One chat message. ``content`` is its text ("" for none); ``tool_calls`` on assistant messages,
    ``tool_call_id`` and ``name`` on tool results."""

    role: str
    content: str = ""
    tool_calls: tuple[FunctionCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    def template_dict(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates take it: a call's ``arguments`` as an object where
        they parse as one (templates write them with ``tojson``), else the text as sent."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments_value(call.arguments)},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out

    def same_reply(self, other: Message) -> bool:
        """Whether ``other`` is this assistant reply as an agent sends it back: same text and the same calls
        (names and arguments; SDKs keep the call ids, but a rewritten id changes no token)."""
        return (
            other.role == self.role
            and other.content == self.content
            and [(c.name, c.arguments) for c in other.tool_calls]
            == [(c.name, c.arguments) for c in self.tool_calls]
        )


def _arguments_value(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


ToolChoice = Literal["none", "auto", "required"] | str  # or the name of the one function to call


@dataclass(frozen=True)
class Sampling:
    """Sampling of a gateway call: the engine's spec, with ``max_tokens`` None for "what the context leaves
    (at most the gateway's ``max_tokens``)"."""

    spec: SamplingSpec
    max_tokens: int | None


@dataclass(frozen=True)
class PinnedSampling:
    """The distribution a session imposes on its calls (``OpenAgentSessionRequest.sampling``): ``spec``'s
    temperature, top_p, top_k, min_p and repetition_penalty replace a call's; ``max_tokens`` (None: no cap)
    caps a call's. A call keeps its own stop strings, seed and min_tokens."""

    spec: SamplingSpec
    max_tokens: int | None = None

    def apply(self, sampling: Sampling) -> Sampling:
        """``sampling`` with this distribution and its max_tokens capped (one left unset stays unset: the
        gateway then gives what the context leaves, within the cap)."""
        spec = replace(
            sampling.spec,
            temperature=self.spec.temperature,
            top_p=self.spec.top_p,
            top_k=self.spec.top_k,
            min_p=self.spec.min_p,
            repetition_penalty=self.spec.repetition_penalty,
        )
        if sampling.max_tokens is None or self.max_tokens is None:
            return Sampling(spec, sampling.max_tokens)
        max_tokens = min(sampling.max_tokens, self.max_tokens)
        return Sampling(replace(spec, max_tokens=max_tokens), max_tokens)


@dataclass(frozen=True)
class ChatRequest:
    """``POST /v1/chat/completions``, validated field by field (tools are JSON-schema function definitions
    as OpenAI sends them). ``top_logprobs`` None: no logprobs; 0: the sampled token's only."""

    messages: tuple[Message, ...]
    sampling: Sampling
    n: int = 1
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: ToolChoice = "auto"
    top_logprobs: int | None = None
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


@dataclass(frozen=True)
class ResponsesRequest:
    """``POST /v1/responses`` as the chat request it means, and what that API adds. ``chat.messages``:
    the system message of ``instructions`` (when given), then the ``input``'s messages.
    ``previous_response_id``: a stored response of the session whose conversation comes before the input;
    ``store``: keep this response for a later ``previous_response_id``; ``metadata``: the caller's
    key-value strings, echoed in the response."""

    chat: ChatRequest
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return self.chat.stream

    @property
    def instruction_messages(self) -> int:
        """How many of ``chat.messages`` come first from ``instructions`` (1 or 0)."""
        return 0 if self.instructions is None else 1

    @property
    def input_messages(self) -> tuple[Message, ...]:
        """The input's messages, without the system message of ``instructions``."""
        return self.chat.messages[self.instruction_messages :]


@dataclass(frozen=True)
class CompletionRequest:
    """``POST /v1/completions``: one prompt, as text or token ids. ``logprobs`` as for chat."""

    prompt: str | tuple[int, ...]
    sampling: Sampling
    n: int = 1
    logprobs: int | None = None
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


@dataclass(frozen=True)
class Choice:
    """One sampled completion: the engine's ids, logprobs and versions, the text (cut at a stop string),
    and for chat the reply message. ``tokens``: each id decoded alone, for OpenAI's logprobs (None when
    none were asked for)."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    text: str
    finish_reason: FinishReason
    message: Message | None = None
    tokens: list[str] | None = None


@dataclass(frozen=True)
class Answer:
    """A served call: ``kind`` "chat" or "completion"; ``prompt_ids`` as fed to the engine."""

    id: str
    kind: Literal["chat", "completion"]
    created: int
    model: str
    prompt_ids: list[int]
    choices: list[Choice]
    call_index: int | None = None  # the session's record of the call (None: outside one, or not generated)


@dataclass(frozen=True)
class SessionTicket:
    """An open session: its id (the capability in its base URL), when it expires (ms since the Unix
    epoch) and the port of the gateway that serves it (0: not known)."""

    session_id: str
    expires_unix_ms: int
    openai_port: int = 0


@dataclass(frozen=True)
class AgentSequence:
    """One branch of a session as a training sequence; all four lists have one entry per token.
    ``loss_mask[i]`` is 1 where the policy sampled ``token_ids[i]``; there ``logprobs[i]`` is its log p under
    the sampling distribution and ``policy_versions[i]`` the version that sampled it. Elsewhere the logprob
    is 0 and the version that of the call that fed the token to the engine."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]


@dataclass(frozen=True)
class AgentTrajectory:
    sequences: list[AgentSequence]
    calls: int
    retokenized_tokens: int
    prefix_mismatches: int
