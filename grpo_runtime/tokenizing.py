"""Hugging Face tokenizer calls, typed for the one shape each caller here uses.

transformers annotates ``decode``, ``convert_tokens_to_ids`` and ``apply_chat_template`` for every mode at
once (one item or a list; text, ids or a dict), so a result is ``str | list[str]`` or a union of five types
even where the arguments fix it. These functions make the call in one mode and return that mode's type.
Nothing of transformers is imported at run time, so services without it can import this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def decode_text(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], *, skip_special_tokens: bool = False
) -> str:
    """``tokenizer.decode`` of a flat list of ids: one string."""
    text = tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
    if not isinstance(text, str):
        raise TypeError(f"decoding a flat list of token ids gave {type(text).__name__}, not str")
    return text


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """``tokenizer.convert_tokens_to_ids`` of one token: its id. TypeError where transformers has none to
    give (None: a token outside a vocabulary without an unknown token)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise TypeError(f"the token {token!r} has no id, converting it gave {found!r}")
    return found


def chat_token_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template (with ``tools`` as JSON-schema
    function definitions when given)."""
    tool_list: list[dict | Callable] | None = list(tools) if tools is not None else None
    ids = tokenizer.apply_chat_template(
        messages,
        tools=tool_list,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )
    # tokenize=True without return_dict renders one conversation to one flat list of ids.
    return list(ids["input_ids"]) if isinstance(ids, dict) else list(cast("list[int]", ids))
