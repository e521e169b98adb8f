"""Validation and tokenization of Generate requests, and the check of what an engine returned.

Every rejection is an InvalidArgument naming the offending field with its index
(``prompts[3]``, ``sampling.top_p``), or a ResourceExhausted naming the server limit it
exceeds (``max_prompts``, ``max_request_sequences``, ``max_request_tokens``), raised before
anything reaches the engine.

Numeric bounds keep every step of the sampler finite in fp32 for finite logits: the sampler
divides logits by T and by the repetition penalty θ (or multiplies by θ), so T and θ are kept
in [1e-2, 1e2] (T = 0 is greedy). Below 1e-2, logits / T leaves fp32's range for logits
above ~3.4e36, and a denormal T turns every positive logit into inf (softmax then NaN);
vLLM clamps T below 1e-2 to 1e-2 for the same reason, here it is refused instead.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import jinja2
import numpy as np
from PIL import Image
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from grpo_runtime.chat_codec import ImagePart, MessageContent, content_images, content_text
from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from grpo_runtime.images import ImageLimits, decode_image
from grpo_runtime.model_classes import image_placeholder
from grpo_runtime.tokenizing import chat_token_ids
from rollout_service.types import (
    GenerateRequest,
    GenerationJob,
    PromptImages,
    PromptInput,
    RawCompletion,
    SamplingSpec,
)

# Bounds as the float32 the protobuf carries, so a caller's 0.01 (0.0099999998) is inside.
MIN_TEMPERATURE = float(np.float32(1e-2))
MAX_TEMPERATURE = 1e2
MIN_REPETITION_PENALTY = float(np.float32(1e-2))
MAX_REPETITION_PENALTY = 1e2
# A prompt longer than this many characters per token of context cannot fit, whatever the
# tokenizer (natural text and code average 3–5): it is refused before tokenizing, which for a
# multi-megabyte text takes tens of seconds and holds the GIL for up to a second at a time.
MAX_CHARS_PER_TOKEN = 32
# Every decode step decodes the completion and searches it for each stop string.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def validate_sampling(s: SamplingSpec) -> SamplingSpec:
    """Check ranges; returns the spec with ``top_k`` −1 normalised to 0 (off)."""
    if not math.isfinite(s.temperature) or not (
        s.temperature == 0 or MIN_TEMPERATURE <= s.temperature <= MAX_TEMPERATURE
    ):
        raise InvalidArgument(
            f"must be 0 (greedy) or in [0.01, {MAX_TEMPERATURE:g}], got {s.temperature}",
            field="sampling.temperature",
        )
    if not math.isfinite(s.top_p) or not 0 < s.top_p <= 1:
        raise InvalidArgument(f"must be in (0, 1], got {s.top_p}", field="sampling.top_p")
    if s.top_k < -1:
        raise InvalidArgument(f"must be >= -1 (-1 or 0 = off), got {s.top_k}", field="sampling.top_k")
    if not math.isfinite(s.min_p) or not 0 <= s.min_p <= 1:
        raise InvalidArgument(f"must be in [0, 1], got {s.min_p}", field="sampling.min_p")
    if s.max_tokens < 1:
        raise InvalidArgument(f"must be >= 1, got {s.max_tokens}", field="sampling.max_tokens")
    if not (
        math.isfinite(s.repetition_penalty)
        and MIN_REPETITION_PENALTY <= s.repetition_penalty <= MAX_REPETITION_PENALTY
    ):
        raise InvalidArgument(
            f"must be in [0.01, {MAX_REPETITION_PENALTY:g}], got {s.repetition_penalty}",
            field="sampling.repetition_penalty",
        )
    if s.min_tokens > s.max_tokens:
        raise InvalidArgument(
            f"must be <= max_tokens ({s.max_tokens}), got {s.min_tokens}", field="sampling.min_tokens"
        )
    if len(s.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(
            f"at most {MAX_STOP_STRINGS} stop strings, got {len(s.stop)}", field="sampling.stop"
        )
    for i, stop in enumerate(s.stop):
        if not stop or len(stop) > MAX_STOP_CHARS:
            raise InvalidArgument(
                f"stop strings must have 1 to {MAX_STOP_CHARS} characters, got {len(stop)}",
                field=f"sampling.stop[{i}]",
            )
    if s.seed is not None and not 0 <= s.seed < 2**63:
        raise InvalidArgument("must be < 2**63", field="sampling.seed")
    if s.top_k == -1:
        return dataclasses.replace(s, top_k=0)
    return s


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt as an engine takes it: its token ids (each image's placeholder expanded to the model's image
    tokens) and, for a prompt with images, its pictures in the forms the engines take (``PromptImages``)."""

    ids: list[int]
    images: PromptImages | None = None


@dataclass(frozen=True)
class RequestValidator:
    """Turns a GenerateRequest into a GenerationJob of token ids, or raises InvalidArgument.

    ``max_model_len``: prompt tokens + ``max_tokens`` may not exceed it. ``max_prompts``,
    ``max_request_sequences`` (prompts × n) and ``max_request_tokens`` (prompts × n ×
    max_tokens before tokenizing, then n × Σ (prompt tokens + max_tokens)) are the server's
    limits on one call; ``image_limits`` bound the images of one prompt. ``processor``: the model's processor
    when it takes images (a vision-language model); without one, a prompt's images are refused after checking.
    """

    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int
    max_prompts: int = 4096
    max_n: int = 1024
    max_request_sequences: int = 16384
    max_request_tokens: int = 1 << 20
    image_limits: ImageLimits = dataclasses.field(default_factory=ImageLimits)
    processor: ProcessorMixin | None = None

    @property
    def takes_images(self) -> bool:
        return self.processor is not None

    def to_job(self, request: GenerateRequest) -> GenerationJob:
        if not request.prompts:
            raise InvalidArgument("at least one prompt is required", field="prompts")
        if len(request.prompts) > self.max_prompts:
            raise ResourceExhausted(
                f"{len(request.prompts)} prompts is more than the server's limit "
                f"max_prompts = {self.max_prompts}",
                field="prompts",
            )
        if request.n < 1:
            raise InvalidArgument(f"must be >= 1, got {request.n}", field="n")
        if request.n > self.max_n:
            raise InvalidArgument(f"must be <= {self.max_n}, got {request.n}", field="n")
        sequences = len(request.prompts) * request.n
        if sequences > self.max_request_sequences:
            raise ResourceExhausted(
                f"prompts × n = {len(request.prompts)} × {request.n} = {sequences} sequences, more than "
                f"the limit max_request_sequences = {self.max_request_sequences}",
                field="n",
            )
        sampling = validate_sampling(request.sampling)
        if sampling.top_k >= self.vocab_size:  # keeps every token: the same as off, for every engine
            sampling = dataclasses.replace(sampling, top_k=0)
        budget = len(request.prompts) * request.n * sampling.max_tokens
        if budget > self.max_request_tokens:
            raise ResourceExhausted(
                f"prompts × n × max_tokens = {len(request.prompts)} × {request.n} × {sampling.max_tokens} = "
                f"{budget} tokens, more than the limit max_request_tokens = {self.max_request_tokens}",
                field="sampling.max_tokens",
            )
        encoded = [self.encode(p, i) for i, p in enumerate(request.prompts)]
        token_ids = [e.ids for e in encoded]
        for i, ids in enumerate(token_ids):
            if len(ids) + sampling.max_tokens > self.max_model_len:
                raise InvalidArgument(
                    f"prompts[{i}] has {len(ids)} tokens; with max_tokens {sampling.max_tokens} that exceeds "
                    f"the model's context of {self.max_model_len}",
                    field="sampling.max_tokens",
                )
        # Every sequence holds its prompt too (prefill, KV cache, and the prompt ids echoed in
        # each completion of the response), so the same limit bounds n × Σ (prompt + max_tokens).
        held = request.n * sum(len(ids) + sampling.max_tokens for ids in token_ids)
        if held > self.max_request_tokens:
            raise ResourceExhausted(
                f"n × Σ (prompt tokens + max_tokens) = {held} tokens, more than the limit "
                f"max_request_tokens = {self.max_request_tokens}",
                field="prompts",
            )
        return GenerationJob(
            prompt_token_ids=token_ids,
            n=request.n,
            sampling=sampling,
            continue_across_updates=request.continue_across_updates,
            min_policy_version=request.min_policy_version,
            images=[e.images for e in encoded],
        )

    def _check_length(self, prompt: PromptInput, field: str) -> None:
        """Refuse, before any tokenizing, a prompt that cannot fit the context."""
        if len(prompt.token_ids) >= self.max_model_len:
            raise InvalidArgument(
                f"{len(prompt.token_ids)} token ids leave no room in the model's context of "
                f"{self.max_model_len}",
                field=field,
            )
        chars = len(prompt.text) + sum(
            len(role) + len(content_text(content)) for role, content in prompt.messages
        )
        if chars > self.max_model_len * MAX_CHARS_PER_TOKEN:
            raise InvalidArgument(
                f"{chars} characters cannot fit the model's context of {self.max_model_len} tokens "
                f"(more than {MAX_CHARS_PER_TOKEN} characters per token)",
                field=field,
            )

    def _decoded_images(self, prompt: PromptInput, field: str) -> list[Image.Image]:
        """Count ``prompt``'s images, then decode each within the image limits (the first bad one refused,
        naming its part); a model that takes no images then refuses the first."""
        images = _images_of(prompt)
        if not images:
            return []
        self.image_limits.check_count(len(images), f"{field}.messages")
        decoded = [
            decode_image(part.data, part.media_type, self.image_limits, f"{field}.{where}")
            for where, part in images
        ]
        if not self.takes_images:
            raise InvalidArgument(
                "this model takes no images (the rollout service serves a text-only model)",
                field=f"{field}.{images[0][0]}",
            )
        return decoded

    def tokenize(self, prompt: PromptInput, index: int, *, tools: list[dict] | None = None) -> list[int]:
        """Token ids of a prompt without images (an episode's turn): refuses one that has images."""
        encoded = self.encode(prompt, index, tools=tools)
        if encoded.images is not None:
            raise InvalidArgument("tool episodes take text prompts only", field=f"prompts[{index}].messages")
        return encoded.ids

    def encode(self, prompt: PromptInput, index: int, *, tools: list[dict] | None = None) -> EncodedPrompt:
        """One prompt as the engine takes it: chat template (+ generation prompt, and ``tools`` as JSON-schema
        function definitions for the template to render; images through the processor), plain text, or ids
        as is."""
        field = f"prompts[{index}]"
        forms = [
            name
            for name, v in (
                ("messages", prompt.messages),
                ("text", prompt.text),
                ("token_ids", prompt.token_ids),
            )
            if v
        ]
        if len(forms) != 1:
            given = ", ".join(forms) if forms else "none"
            raise InvalidArgument(
                f"set exactly one of messages, text, token_ids (given: {given})", field=field
            )
        self._check_length(prompt, field)
        encoded = EncodedPrompt([])
        if prompt.messages:
            encoded = self._encode_messages(prompt, field, tools)
        elif prompt.text:
            encoded = EncodedPrompt(list(self.tokenizer(prompt.text)["input_ids"]))
        else:
            encoded = EncodedPrompt(list(prompt.token_ids))
            for j, t in enumerate(encoded.ids):
                if not 0 <= t < self.vocab_size:
                    raise InvalidArgument(
                        f"token id {t} is outside the vocabulary [0, {self.vocab_size})",
                        field=f"{field}.token_ids[{j}]",
                    )
        if not encoded.ids:
            raise InvalidArgument("the prompt has no tokens", field=field)
        if encoded.images is None:
            self._check_no_image_tokens(encoded.ids, field)
        return encoded

    def _encode_messages(self, prompt: PromptInput, field: str, tools: list[dict] | None) -> EncodedPrompt:
        if self.tokenizer.chat_template is None:
            raise InvalidArgument(
                "this model has no chat template; send text or token_ids", field=f"{field}.messages"
            )
        for j, (role, _) in enumerate(prompt.messages):
            if not role:
                raise InvalidArgument("role must not be empty", field=f"{field}.messages[{j}].role")
        images = self._decoded_images(prompt, field)
        try:
            if images:
                return self._encode_with_images(prompt, images, field)
            messages = [{"role": role, "content": content_text(content)} for role, content in prompt.messages]
            return EncodedPrompt(
                chat_token_ids(self.tokenizer, messages, add_generation_prompt=True, tools=tools)
            )
        except jinja2.TemplateError as exc:  # the template's raise_exception: roles out of order, ...
            raise InvalidArgument(
                f"the chat template refused them: {exc}", field=f"{field}.messages"
            ) from exc

    def _encode_with_images(
        self, prompt: PromptInput, images: list[Image.Image], field: str
    ) -> EncodedPrompt:
        """Render the messages with their parts (an image part as ``{"type": "image"}``, where the template
        writes the processor's placeholder), then let the processor expand each placeholder to the model's
        image tokens and compute the pixel inputs. A placeholder the caller typed, or a template that drops
        an image, would pair images with the wrong tokens: the counts must agree."""
        assert self.processor is not None  # _decoded_images refused images otherwise
        messages: list[Any] = [
            {"role": role, "content": _template_parts(content)} for role, content in prompt.messages
        ]
        text = str(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        placeholder, _ = image_placeholder(self.processor)
        if (found := text.count(placeholder)) != len(images):
            raise InvalidArgument(
                f"the rendered prompt holds {found} image placeholders {placeholder!r} for {len(images)} "
                "images (a text part may not contain the placeholder)",
                field=f"{field}.messages",
            )
        out = self.processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
        inputs = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        placeholder_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        images_in = PromptImages(inputs, tuple(images), placeholder_ids)
        return EncodedPrompt(out["input_ids"][0].tolist(), images_in)

    def _check_no_image_tokens(self, ids: list[int], field: str) -> None:
        """A prompt without images must not carry the model's image token (typed as text or as an id): the
        model would look for image features that are not there."""
        if self.processor is None:
            return
        _, image_token_id = image_placeholder(self.processor)
        if image_token_id in ids:
            raise InvalidArgument(
                f"the prompt holds the image token {image_token_id} but no image", field=field
            )


def _template_parts(content: MessageContent) -> str | list[dict[str, str]]:
    """A message's content as chat templates of vision-language models take it (TRL's and HF's form)."""
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": part} if isinstance(part, str) else {"type": "image"} for part in content
    ]


def _images_of(prompt: PromptInput) -> list[tuple[str, ImagePart]]:
    """Each image of ``prompt``'s messages with its field path below the prompt."""
    return [
        (f"messages[{j}].parts[{k}].image", part)
        for j, (_, content) in enumerate(prompt.messages)
        for k, part in content_images(content)
    ]


def check_completions(results: list[RawCompletion], vocab_size: int, n: int) -> None:
    """The last guard before a response: every logprob finite, every token id in the vocabulary.

    A non-finite logprob means the serving weights (or an engine) produced non-finite logits;
    that is the server's state, not the request's, so the call fails with FAILED_PRECONDITION
    instead of returning NaN with OK.
    """
    for k, raw in enumerate(results):
        where = f"prompts[{k // n}] sample {k % n}"
        if len(raw.logprobs) != len(raw.token_ids):
            raise FailedPrecondition(
                f"the engine returned {len(raw.logprobs)} logprobs for {len(raw.token_ids)} tokens ({where})"
            )
        if raw.logprobs and not np.isfinite(np.asarray(raw.logprobs, dtype=np.float64)).all():
            raise FailedPrecondition(
                f"the engine produced a non-finite logprob ({where}): the serving weights give "
                "non-finite logits; push or load finite weights"
            )
        if raw.token_ids and not all(0 <= t < vocab_size for t in raw.token_ids):
            raise FailedPrecondition(f"the engine produced a token id outside [0, {vocab_size}) ({where})")
