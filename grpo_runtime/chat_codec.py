"""Chat messages of the contracts (``grpo.common.v1.ChatMessage``) both directions, shared by every codec
that reads one (``rollout_service.codec``, ``reward_service.codec``), so text and image parts, and the
refusal of a message that sets both ``content`` and ``parts``, read the same wherever one arrives.

A message's content is its text, or its parts in order: a ``str`` for a text part, an :class:`ImagePart`
(the bytes as sent, not decoded here: each service checks them against its own image limits) for an image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo.common.v1 import common_pb2

from grpo_runtime.errors import InvalidArgument


@dataclass(frozen=True)
class ImagePart:
    """An image part of a chat message as the caller sent it: the encoded bytes and the declared media
    type (decoded and checked by :func:`grpo_runtime.images.decode_image`)."""

    data: bytes
    media_type: str


# A chat message's content: its text, or its parts in order (text and images).
MessageContent = str | tuple[str | ImagePart, ...]


def content_text(content: MessageContent) -> str:
    """The text of a message's content: its text parts joined by newlines, as vLLM joins them for a
    text-only model (images left out)."""
    if isinstance(content, str):
        return content
    return "\n".join(part for part in content if isinstance(part, str))


def content_images(content: MessageContent) -> list[tuple[int, ImagePart]]:
    """The image parts of a message's content with their part indices."""
    if isinstance(content, str):
        return []
    return [(k, part) for k, part in enumerate(content) if isinstance(part, ImagePart)]


def encode_chat_message(message: Mapping[str, Any]) -> common_pb2.ChatMessage:
    """``{"role", "content"}``; a list ``content`` is its parts: ``{"type": "text", "text"}`` or
    ``{"type": "image", "data": bytes, "media_type"}``."""
    content = message.get("content") or ""
    if isinstance(content, str):
        return common_pb2.ChatMessage(role=message["role"], content=content)
    out = common_pb2.ChatMessage(role=message["role"])
    for part in content:
        if part.get("type") == "image":
            out.parts.add(image=common_pb2.Image(data=part["data"], media_type=part["media_type"]))
        elif part.get("type") == "text":
            out.parts.add(text=part["text"])
        else:
            raise ValueError(f"a content part is text or image, got {part.get('type')!r}")
    return out


def decode_chat_message(msg: common_pb2.ChatMessage, field: str) -> tuple[str, MessageContent]:
    """(role, content): the text, or the parts in order; ``field`` names the message in errors."""
    if not msg.parts:
        return msg.role, msg.content
    if msg.content:
        raise InvalidArgument("set content or parts, not both", field=field)
    parts: list[str | ImagePart] = []
    for k, part in enumerate(msg.parts):
        kind = part.WhichOneof("part")
        if kind is None:
            raise InvalidArgument("a part needs text or an image", field=f"{field}.parts[{k}]")
        parts.append(part.text if kind == "text" else ImagePart(part.image.data, part.image.media_type))
    return msg.role, tuple(parts)
