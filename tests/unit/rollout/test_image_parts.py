"""Images in chat prompts (ChatMessage.parts): both directions of the codec, and validation that counts,
decodes and bounds every image before the model sees the prompt — a text-only model then refuses it,
naming the part. Every hostile image is INVALID_ARGUMENT naming its field."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from grpo_runtime.chat_codec import ImagePart
from grpo_runtime.errors import InvalidArgument
from grpo_runtime.images import ImageLimits
from rollout_service.codec import decode_prompt, encode_prompt
from rollout_service.core.validation import RequestValidator
from rollout_service.types import GenerateRequest, PromptInput, SamplingSpec
from tests.support.hostile_images import animation, corrupt_jpeg, encoded, picture, png_bomb

PNG = encoded(picture(), "PNG")
LIMITS = ImageLimits(max_images=2, max_image_bytes=64 * 1024, max_image_pixels=64 * 64)


@pytest.fixture(scope="module")
def validator(tiny_models) -> RequestValidator:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    return RequestValidator(tokenizer, max_model_len=256, vocab_size=len(tokenizer), image_limits=LIMITS)


def chat(*parts: str | ImagePart) -> GenerateRequest:
    prompt = PromptInput(messages=(("user", tuple(parts)),))
    return GenerateRequest(prompts=(prompt,), n=1, sampling=SamplingSpec(max_tokens=4))


def test_parts_round_trip_in_order():
    message = {
        "role": "user",
        "content": [
            {"type": "image", "data": PNG, "media_type": "image/png"},
            {"type": "text", "text": "How many squares?"},
        ],
    }
    decoded = decode_prompt(encode_prompt([message], "p"), 0)
    assert decoded.messages == (("user", (ImagePart(PNG, "image/png"), "How many squares?")),)


def test_content_and_parts_together_or_an_empty_part_name_the_field():
    both = encode_prompt([{"role": "user", "content": [{"type": "text", "text": "a"}]}], "p")
    both.messages[0].content = "b"
    with pytest.raises(InvalidArgument) as error:
        decode_prompt(both, 3)
    assert error.value.field == "prompts[3].messages[0]"
    empty = encode_prompt([{"role": "user", "content": [{"type": "text", "text": "a"}]}], "p")
    empty.messages[0].parts.add()
    with pytest.raises(InvalidArgument) as error:
        decode_prompt(empty, 0)
    assert error.value.field == "prompts[0].messages[0].parts[1]"


def test_text_parts_tokenize_as_their_joined_text(validator):
    parts = validator.to_job(chat("What is", "12 + 7?")).prompt_token_ids[0]
    joined = PromptInput(messages=(("user", "What is\n12 + 7?"),))
    assert parts == validator.tokenize(joined, 0)


@pytest.mark.parametrize(
    ("parts", "field", "why"),
    [
        ((ImagePart(PNG[: len(PNG) // 2], "image/png"),), "parts[0].image", ""),
        (("look", ImagePart(corrupt_jpeg(), "image/jpeg")), "parts[1].image", ""),
        ((ImagePart(png_bomb(), "image/png"),), "parts[0].image", "max_image_pixels"),
        ((ImagePart(encoded(picture(80, 80), "PNG"), "image/png"),), "parts[0].image", "max_image_pixels"),
        ((ImagePart(PNG, "image/jpeg"),), "parts[0].image", ""),
        ((ImagePart(PNG, "image/gif"),), "parts[0].image", "media type"),
        ((ImagePart(animation("PNG"), "image/png"),), "parts[0].image", ""),
        ((ImagePart(b"\x00" * (65 * 1024), "image/png"),), "parts[0].image", "max_image_bytes"),
        ((ImagePart(PNG, "image/png"),) * 3, "", "max_images"),
    ],
    ids=["truncated", "corrupt", "bomb", "over-pixels", "wrong-type", "gif", "animated", "oversized", "many"],
)
def test_hostile_images_are_invalid_argument_naming_the_part(validator, parts, field, why):
    with pytest.raises(InvalidArgument) as error:
        validator.to_job(chat(*parts))
    assert error.value.field == "prompts[0].messages" + (f"[0].{field}" if field else "")
    assert why in error.value.message


def test_a_text_only_model_refuses_a_valid_image_naming_it(validator):
    with pytest.raises(InvalidArgument, match="takes no images") as error:
        validator.to_job(chat("How many squares?", ImagePart(PNG, "image/png")))
    assert error.value.field == "prompts[0].messages[0].parts[1].image"
