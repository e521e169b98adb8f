"""RolloutCore with the HF engine, without gRPC: the acceptance behaviours of the HF engine."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from grpo_runtime.errors import FailedPrecondition, InvalidArgument, Unavailable
from rollout_service.core import rollout as rollout_module
from rollout_service.core.rollout import RolloutCore
from rollout_service.engines.hf import HFEngine
from rollout_service.types import (
    FinishReason,
    GenerateRequest,
    GenerationJob,
    PromptInput,
    SamplingSpec,
    WeightFormat,
    WeightPayload,
)
from rollout_service.weights import ParamCatalog, sha256_hex, state_dict_bytes, validate_payload

PROMPTS = (
    PromptInput(id="text", text="What is 12 + 7?"),
    PromptInput(id="chat", messages=(("user", "Compute 3 * 4 - 5."),)),
    PromptInput(id="ids", token_ids=(5, 6, 7, 8)),
)


async def make_core(model_dir) -> RolloutCore:
    engine = HFEngine(str(model_dir), max_batch_size=64)
    core = RolloutCore(engine, engine.tokenizer, ParamCatalog.from_model_dir(model_dir), batch_window_s=0.01)
    await core.start()
    return core


@pytest.fixture
async def core(tiny_models):
    core = await make_core(tiny_models["policy"])
    yield core
    await core.close()


def request(n: int = 2, prompts=PROMPTS, **sampling) -> GenerateRequest:
    sampling.setdefault("max_tokens", 12)
    return GenerateRequest(prompts=prompts, n=n, sampling=SamplingSpec(**sampling))


def trl_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """What TRL recomputes: selective_log_softmax(logits / T) on prompt + completion."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def lora_payload(model_dir, version: int) -> tuple[WeightPayload, torch.nn.Module]:
    """A PEFT adapter with nonzero B, and the merged model it should be equivalent to."""
    torch.manual_seed(version)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(
            r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        ),
    )
    data = state_dict_bytes(get_peft_model_state_dict(peft_model))
    config = json.dumps(peft_model.peft_config["default"].to_dict(), default=sorted)
    payload = WeightPayload(version, WeightFormat.LORA_ADAPTER, data, sha256_hex(data), len(data), config)
    return payload, peft_model.merge_and_unload()


async def test_counts_order_and_forms(core):
    results = await core.generate(request(n=3))
    assert [r.prompt_id for r in results] == ["text"] * 3 + ["chat"] * 3 + ["ids"] * 3
    assert results[6].prompt_token_ids == [5, 6, 7, 8]
    for r in results:
        assert len(r.token_ids) == len(r.logprobs) <= 12
        assert r.policy_version == 0
        assert r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if r.finish_reason == FinishReason.LENGTH:
            assert len(r.token_ids) == 12


async def test_seed_reproduces_and_differs(core):
    a = await core.generate(request(seed=7, temperature=0.9))
    b = await core.generate(request(seed=7, temperature=0.9))
    c = await core.generate(request(seed=8, temperature=0.9))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    assert a[0].token_ids != a[1].token_ids  # the n samples of one prompt differ


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
async def test_logprobs_match_a_fresh_transformers_forward(core, tiny_models, temperature):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"], dtype=torch.float32).eval()
    results = await core.generate(request(n=4, temperature=temperature, max_tokens=24, top_p=0.9, seed=1))
    diffs = [
        (trl_logprobs(model, r.prompt_token_ids, r.token_ids, temperature) - torch.tensor(r.logprobs))
        .abs()
        .mean()
        for r in results
    ]
    assert max(diffs) <= 1e-4


async def test_stop_strings_cut_text(core):
    results = await core.generate(request(n=8, max_tokens=24, stop=("e", "a"), seed=3))
    stopped = [r for r in results if r.finish_reason == FinishReason.STOP]
    assert stopped
    for r in results:
        assert "e" not in r.text and "a" not in r.text
    decoded = core.tokenizer.decode(stopped[0].token_ids, skip_special_tokens=True)
    assert decoded.startswith(stopped[0].text) and decoded != stopped[0].text


async def test_min_tokens_and_greedy(core):
    greedy = await core.generate(request(n=3, temperature=0.0, max_tokens=8))
    assert greedy[0].token_ids == greedy[1].token_ids == greedy[2].token_ids
    long = await core.generate(request(n=4, min_tokens=10, max_tokens=10, seed=2))
    assert all(len(r.token_ids) == 10 for r in long)


async def test_concurrent_calls_share_batches(core):
    calls = [core.generate(request(n=2, seed=s, max_tokens=6)) for s in range(6)]
    together = await asyncio.gather(*calls)
    alone = [await core.generate(request(n=2, seed=s, max_tokens=6)) for s in range(6)]
    assert [[r.token_ids for r in rs] for rs in together] == [[r.token_ids for r in rs] for rs in alone]


async def test_cancelled_call_stops_its_work(core):
    task = asyncio.create_task(core.generate(request(n=64, max_tokens=400, prompts=PROMPTS[:1])))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The engine is free again quickly (it stopped between decode steps).
    quick = await asyncio.wait_for(core.generate(request(n=1, max_tokens=2)), timeout=5)
    assert len(quick) == 3


async def test_lora_and_state_dict_updates_change_generation(core, tiny_models):
    before = await core.generate(request(seed=5, temperature=0.8))
    payload, merged = lora_payload(tiny_models["policy"], 1)
    applied = await core.update_weights(payload)
    assert applied.policy_version == 1 and applied.tensors_loaded == 12
    after = await core.generate(request(seed=5, temperature=0.8, max_tokens=16))
    assert {r.policy_version for r in after} == {1}
    assert [r.token_ids for r in after] != [r.token_ids[:16] for r in before]
    diffs = [
        (trl_logprobs(merged, r.prompt_token_ids, r.token_ids, 0.8) - torch.tensor(r.logprobs)).abs().mean()
        for r in after
    ]
    assert max(diffs) <= 1e-4  # the merged adapter is exactly W0 + s·B·A

    base = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    partial = {k: v * 1.5 for k, v in base.state_dict().items() if "layers.1.mlp" in k}
    data = state_dict_bytes(partial)
    await core.update_weights(WeightPayload(2, WeightFormat.STATE_DICT, data, sha256_hex(data)))
    base.load_state_dict(partial, strict=False)  # the adapter is dropped: base + partial
    results = await core.generate(request(seed=5, temperature=0.8))
    assert core.status().policy_version == 2 and core.status().weight_format == WeightFormat.STATE_DICT
    diffs = [
        (trl_logprobs(base, r.prompt_token_ids, r.token_ids, 0.8) - torch.tensor(r.logprobs)).abs().mean()
        for r in results
    ]
    assert max(diffs) <= 1e-4


async def test_corrupt_updates_leave_old_weights_serving(core, tiny_models):
    payload, _ = lora_payload(tiny_models["policy"], 3)
    await core.update_weights(payload)
    reference = await core.generate(request(seed=9))
    good = payload.data
    corrupt = [
        (
            WeightPayload(
                4, WeightFormat.LORA_ADAPTER, good[:-9], sha256_hex(good[:-9]), 0, payload.adapter_config_json
            ),
            "data",
        ),
        (
            WeightPayload(4, WeightFormat.LORA_ADAPTER, good, "ab" * 32, 0, payload.adapter_config_json),
            "sha256",
        ),
        (
            WeightPayload(
                3, WeightFormat.LORA_ADAPTER, good, sha256_hex(good), 0, payload.adapter_config_json
            ),
            "version",
        ),
        (WeightPayload(4, WeightFormat.STATE_DICT, good, sha256_hex(good)), "data"),
    ]
    for bad, field in corrupt:
        with pytest.raises(InvalidArgument) as info:
            await core.update_weights(bad)
        assert info.value.field == field
    assert core.status().policy_version == 3
    assert [r.token_ids for r in await core.generate(request(seed=9))] == [r.token_ids for r in reference]


async def test_a_call_sent_during_a_push_generates_with_the_weights_it_waits_for(core, tiny_models):
    payload, merged = lora_payload(tiny_models["policy"], 1)
    waiting = asyncio.create_task(core.generate(dataclasses.replace(request(seed=5), min_policy_version=1)))
    await asyncio.sleep(0.05)  # far past the batch window: it would have generated by now
    assert not waiting.done()
    await core.update_weights(payload)
    results = await waiting
    assert {r.policy_version for r in results} == {1}
    diffs = [
        (trl_logprobs(merged, r.prompt_token_ids, r.token_ids, 1.0) - torch.tensor(r.logprobs)).abs().mean()
        for r in results
    ]
    assert max(diffs) <= 1e-4
    # A version already served, or an earlier one, does not wait.
    served = await core.generate(dataclasses.replace(request(), min_policy_version=1))
    assert {r.policy_version for r in served} == {1}


async def test_a_call_waiting_for_a_version_fails_when_its_update_fails_or_never_comes(core, tiny_models):
    payload, _ = lora_payload(tiny_models["policy"], 2)
    waiting = asyncio.create_task(core.generate(dataclasses.replace(request(), min_policy_version=2)))
    await asyncio.sleep(0.05)
    bad = dataclasses.replace(payload, sha256="ab" * 32)
    with pytest.raises(InvalidArgument):
        await core.update_weights(bad)
    with pytest.raises(Unavailable, match="update to version 2 failed") as info:
        await waiting
    assert info.value.field == "min_policy_version"
    with pytest.raises(InvalidArgument, match="below 2\\*\\*63") as info:
        await core.generate(dataclasses.replace(request(), min_policy_version=2**64 - 1))
    assert info.value.field == "min_policy_version"
    core.version_waits.wait_s = 0.05
    with pytest.raises(Unavailable, match="has not arrived within version_wait_s") as info:
        await core.generate(dataclasses.replace(request(), min_policy_version=3))
    assert info.value.field == "min_policy_version" and core.status().policy_version == 0


async def test_sleep_refuses_generation_and_wake_restores(core):
    reference = await core.generate(request(seed=4))
    await core.sleep(1)
    with pytest.raises(FailedPrecondition, match="asleep"):
        await core.generate(request())
    status = core.status()
    assert status.sleep_level == 1 and status.sleeping_tags == ("kv_cache", "weights")
    wake = await core.wake_up([])
    assert wake.weights_valid
    assert [r.token_ids for r in await core.generate(request(seed=4))] == [r.token_ids for r in reference]


@pytest.mark.slow
async def test_level_two_sleep_frees_weights_until_a_push(tiny_models):
    """policy-large (23M parameters, 92 MB fp32) so the release is measurable in RSS."""
    core = await make_core(tiny_models["policy-large"])

    async def push(version: int, weights: dict[str, torch.Tensor]) -> None:
        data = state_dict_bytes(weights)
        await core.update_weights(WeightPayload(version, WeightFormat.STATE_DICT, data, sha256_hex(data)))

    try:
        await push(1, {"model.norm.weight": torch.full((512,), 2.0)})
        await core.generate(request(n=1, max_tokens=2))
        slept = await core.sleep(2)
        freed = slept.memory_before.rss_bytes - slept.memory_after.rss_bytes
        assert freed > 60e6, f"sleep(2) freed only {freed / 1e6:.1f} MB"
        assert core.status().sleep_level == 2
        with pytest.raises(FailedPrecondition):
            await push(2, {"model.norm.weight": torch.ones(512)})  # the weights are asleep
        await core.wake_up(["weights"])
        await core.wake_up(["kv_cache"])
        assert not core.status().weights_valid
        with pytest.raises(FailedPrecondition, match="level-2"):
            await core.generate(request(n=1))
        await push(2, {"model.layers.0.input_layernorm.weight": torch.full((512,), 0.5)})
        results = await core.generate(request(n=1))
        assert core.status().weights_valid and {r.policy_version for r in results} == {2}
        state = core.engine.model.state_dict()
        assert torch.equal(state["model.norm.weight"], torch.full((512,), 2.0))  # version 1 kept
        assert torch.equal(state["model.layers.0.input_layernorm.weight"], torch.full((512,), 0.5))
    finally:
        await core.close()


def test_a_cancelled_job_stops_within_a_step_and_its_later_batches_are_never_built(tiny_models):
    """40 prompts × n 2 in batches of 4 rows: cancelled during the first batch's decode, the job
    costs a few more forward passes, not the 19 other batches; a second job in the same engine
    call is served in full."""
    engine = HFEngine(str(tiny_models["policy"]), max_batch_size=4)
    sampling = SamplingSpec(max_tokens=50, min_tokens=50)
    doomed = GenerationJob(prompt_token_ids=[[5 + i, 6, 7] for i in range(40)], n=2, sampling=sampling)
    kept = GenerationJob(prompt_token_ids=[[9, 10]], n=1, sampling=SamplingSpec(max_tokens=3, min_tokens=3))
    forwards = []

    def cancel_after_five_steps(*_):
        forwards.append(1)
        if len(forwards) == 5:
            doomed.cancel.cancel()

    hook = engine.model.register_forward_hook(cancel_after_five_steps)
    try:
        engine.generate([doomed, kept])
    finally:
        hook.remove()
    assert len(forwards) <= 5 + 1 + 4  # the step that saw the cancel, then kept's own batch
    assert all(r.finish_reason == FinishReason.ABORT for r in doomed.results)
    assert sum(len(r.token_ids) for r in doomed.results) <= 4 * 5
    assert [len(r.token_ids) for r in kept.results] == [3]
    assert kept.results[0].finish_reason == FinishReason.LENGTH


async def test_load_weights_needs_a_root_that_confines(core, tiny_models):
    core.weights_root = Path("/")  # the working directory of a container without a WORKDIR
    with pytest.raises(FailedPrecondition, match="weights_root"):
        await core.load_weights(str(tiny_models["policy"]), 1, WeightFormat.UNSPECIFIED)
    assert core.status().policy_version == 0


async def test_engine_calls_and_validation_run_on_the_core_compute_thread(core, tiny_models, monkeypatch):
    """Generation, validation, the apply and sleep/wake all run on one thread, so the process keeps one
    OpenMP pool (grpo_runtime.compute_thread)."""
    threads: dict[str, set[int]] = {}
    engine = core.engine
    for name in ("generate", "apply_update", "sleep", "wake_up"):
        method = getattr(engine, name)

        def recorded(*args, _method=method, _name=name, **kwargs):
            threads.setdefault(_name, set()).add(threading.get_ident())
            return _method(*args, **kwargs)

        setattr(engine, name, recorded)

    def validate(*args, **kwargs):
        threads.setdefault("validate_payload", set()).add(threading.get_ident())
        return validate_payload(*args, **kwargs)

    monkeypatch.setattr(rollout_module, "validate_payload", validate)
    payload, _ = lora_payload(tiny_models["policy"], 1)
    await asyncio.gather(core.generate(request(n=1)), core.generate(request(n=2)))
    await core.update_weights(payload)
    await core.generate(request(n=1))
    await core.sleep(1)
    await core.wake_up([])
    used = set().union(*threads.values())
    assert set(threads) == {"generate", "validate_payload", "apply_update", "sleep", "wake_up"}
    assert used == {core.compute.ident}
