"""The HF engine's preallocated KV cache gives attention what transformers' DynamicCache gives it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Gemma2Config
from transformers.cache_utils import DynamicLayer

from rollout_service.engines.hf_cache import PreallocatedLayer, decode_cache


@pytest.fixture(scope="module")
def policy(tiny_models):
    return AutoModelForCausalLM.from_pretrained(tiny_models["policy"], dtype=torch.float32).eval()


def decode(model, cache, steps: int, select_at: int, keep: list[int]) -> list[torch.Tensor]:
    """Prefill 4 rows (one left-padded), then ``steps`` greedy tokens; rows ``keep`` after ``select_at``."""
    torch.manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (4, 6))
    attention = torch.ones_like(prompt)
    attention[0, :2] = 0  # a shorter, left-padded prompt
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = []
    with torch.inference_mode():
        out = model(
            input_ids=prompt,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for step in range(steps):
            logits.append(out.logits[:, -1].clone())
            tokens = out.logits[:, -1].argmax(-1)
            if step == select_at:
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                attention, positions, tokens = attention[index], positions[index], tokens[index]
            attention = torch.cat([attention, torch.ones((len(tokens), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
    return logits


@pytest.mark.parametrize("capacity", [6 + 8, 7])  # room for everything; too small, so it grows
def test_same_logits_as_the_dynamic_cache(policy, capacity):
    cache = decode_cache(policy.config, capacity)
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    ours = decode(policy, cache, steps=8, select_at=3, keep=[0, 2, 3])
    reference = decode(policy, DynamicCache(config=policy.config), steps=8, select_at=3, keep=[0, 2, 3])
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=f"step {step}")
    assert cache.get_seq_length() == 6 + 8


def test_steps_are_written_in_place():
    layer = PreallocatedLayer(capacity=8)
    keys = torch.randn(2, 1, 3, 4)
    layer.update(keys, keys + 1)
    buffer = layer._key_buffer
    step = torch.randn(2, 1, 1, 4)
    k, v = layer.update(step, step + 1)
    assert layer._key_buffer is buffer and k.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(k, torch.cat([keys, step], dim=-2))
    torch.testing.assert_close(v, torch.cat([keys + 1, step + 1], dim=-2))
    assert layer.get_seq_length() == 4


def test_crop_and_repeat_keep_what_dynamic_layer_keeps():
    ours, reference = PreallocatedLayer(capacity=8), DynamicLayer()
    keys = torch.randn(2, 1, 5, 4)
    for layer in (ours, reference):
        layer.update(keys, keys + 1)
        layer.crop(-2)  # drop the last two positions
        layer.batch_repeat_interleave(3)
    assert ours.get_seq_length() == reference.get_seq_length() == 3
    torch.testing.assert_close(ours.keys, reference.keys)
    torch.testing.assert_close(ours.values, reference.values)
    step = torch.randn(6, 1, 1, 4)
    torch.testing.assert_close(ours.update(step, step)[0], reference.update(step, step)[0])


def test_sliding_window_models_keep_transformers_layers():
    config = Gemma2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
    )
    cache = decode_cache(config, capacity=16)
    assert not any(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    assert any(type(layer) is not DynamicLayer for layer in cache.layers)
