"""The rollout service serving the tiny vision-language model (models/vision) behind a real gRPC server on
127.0.0.1: the RolloutClient sends pictures as image parts, the HF engine answers from them, and bad
images or smuggled placeholders are INVALID_ARGUMENT naming the field while the server goes on serving."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from transformers import AutoConfig

from grpo_runtime.images import encode_png
from rollout_service.client import RolloutClient
from rollout_service.settings import RolloutSettings
from tests.integration.rollout.fixtures import rollout_server_thread
from tests.support.hostile_images import png_bomb
from tests.support.statuses import failure
from tiny_models import vision_task

VISION = Path(__file__).resolve().parents[3] / "models" / "vision"
IMAGE_TOKENS = 4  # one per 28-pixel cell of the 56-pixel picture


@pytest.fixture(scope="module")
def client():
    settings = RolloutSettings(model=str(VISION), engine="auto")  # auto: the HF engine for a VLM
    with rollout_server_thread(settings) as running, RolloutClient(running.address) as client:
        yield client


def question(image: bytes, text: str = vision_task.QUESTION) -> list[dict]:
    parts = [{"type": "image", "data": image, "media_type": "image/png"}, {"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


def test_pictures_are_answered_through_grpc(client):
    pictures = vision_task.pictures("test", 24)
    prompts = [question(encode_png(p.image())) for p in pictures]
    results = client.generate(prompts, n=1, sampling={"max_tokens": 4, "temperature": 0.0})
    assert all(len(r.logprobs) == len(r.token_ids) for r in results)
    image_token = AutoConfig.from_pretrained(VISION).image_token_id
    assert all(r.prompt_token_ids.count(image_token) == IMAGE_TOKENS for r in results)
    right = sum(r.text.strip() == p.answer for r, p in zip(results, pictures, strict=True))
    assert right / len(pictures) > 0.3  # chance is 0.25; the shipped model reaches ~0.5


@pytest.mark.parametrize(
    ("image", "text", "field", "why"),
    [
        (png_bomb(), vision_task.QUESTION, "prompts[0].messages[0].parts[0].image", "max_image_pixels"),
        (None, "<image> how many?", "prompts[0].messages", "image placeholders"),
    ],
)
def test_bad_pictures_are_refused_naming_the_field_and_the_server_goes_on(client, image, text, field, why):
    data = image if image is not None else encode_png(vision_task.blank_image())
    code, details = failure(lambda: client.generate([question(data, text)], n=1, sampling={"max_tokens": 2}))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}:") and why in details
    [result] = client.generate(
        [question(encode_png(vision_task.blank_image()))], n=1, sampling={"max_tokens": 2}
    )
    assert result.token_ids
