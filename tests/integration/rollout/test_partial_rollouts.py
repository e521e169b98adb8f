"""Partial rollouts on a real loopback server, HF engine (and vLLM, slow): a weight update that arrives while
a ``continue_across_updates`` call generates pauses it at a segment boundary, applies, and the call goes on
with the new weights; without the flag the update waits for the call to end."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollout_service.settings import RolloutSettings
from tests.integration.rollout.fixtures import generate_while_pushing, rollout_server_thread

PROMPT = [5, 6, 7, 8]
# Long enough (most of the tiny model's 512 positions) that a push made once the prefill ran lands
# mid-generation; min_tokens keeps EOS from ending it early.
LONG = {"max_tokens": 480, "min_tokens": 480, "temperature": 1.0, "seed": 7}
SEGMENT_TOKENS = 8


TOLERANCE = 1e-4  # |rollout logprob - fresh transformers scoring| per token


@pytest.fixture(
    scope="module", params=["hf", pytest.param("vllm", marks=[pytest.mark.slow, pytest.mark.vllm])]
)
def server(tiny_models, request):
    settings = RolloutSettings(
        model=str(tiny_models["policy"]),
        engine=request.param,
        partial_segment_tokens=SEGMENT_TOKENS,
        max_model_len=512,
        max_batch_size=64,
    )
    with rollout_server_thread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def base_state(tiny_models) -> dict[str, torch.Tensor]:
    state = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).state_dict()
    state.pop("lm_head.weight")  # tied to the embeddings
    return state


def scored_logprobs(
    model: torch.nn.Module, prompt: list[int], tokens: list[int], blocked: list[int] = ()
) -> torch.Tensor:
    """log_softmax(logits)[token] of each completion token under ``model`` (T = 1), one forward pass;
    ``blocked`` ids get −inf first (vLLM's processed logprobs leave out the EOS that min_tokens blocks)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logits[:, list(blocked)] = float("-inf")
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def model_with(tiny_models, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    model.load_state_dict(state, strict=False)
    return model.eval()


def test_update_mid_generation_switches_weights_at_a_boundary(server, client, tiny_models, base_state):
    old_version = client.status().policy_version
    old = {name: tensor.clone() for name, tensor in base_state.items()}
    client.push_state_dict(old, version=old_version + 1)
    old_version += 1
    # Every tensor changes, the embeddings (tied to the LM head) included.
    new = {name: tensor * 1.1 for name, tensor in base_state.items()}
    new_version = old_version + 1
    applied: list[int] = []

    def push() -> None:
        applied.append(client.push_state_dict(new, version=new_version).policy_version)

    completions = generate_while_pushing(server, client, push, [PROMPT], LONG, partial=True)
    assert applied == [new_version]
    old_model, new_model = model_with(tiny_models, old), model_with(tiny_models, new)
    blocked = [old_model.generation_config.eos_token_id] if server.core.engine.name == "vllm" else []
    for completion in completions:
        versions = completion.token_versions
        assert len(versions) == len(completion.token_ids) == LONG["max_tokens"]
        assert versions == sorted(versions) and set(versions) == {old_version, new_version}
        assert completion.policy_version == old_version  # the oldest token's
        switch = versions.index(new_version)
        if server.core.engine.name == "hf":
            assert switch % SEGMENT_TOKENS == 0  # paused at a segment boundary (vLLM: of engine steps)
        reported = torch.tensor(completion.logprobs)
        under_old = scored_logprobs(old_model, completion.prompt_token_ids, completion.token_ids, blocked)
        under_new = scored_logprobs(new_model, completion.prompt_token_ids, completion.token_ids, blocked)
        # Each token's logprob is that of the weights that sampled it, also right after the switch (the
        # engine recomputed the prefix's KV under the new weights).
        torch.testing.assert_close(reported[:switch], under_old[:switch], atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(reported[switch:], under_new[switch:], atol=TOLERANCE, rtol=0)
        assert (reported[switch:] - under_old[switch:]).abs().max() > 1e-2  # the versions really differ


def test_without_the_flag_the_update_waits_and_one_version_samples_everything(server, client, base_state):
    version = client.status().policy_version
    applied: list[int] = []

    def push() -> None:
        state = {name: tensor * 0.95 for name, tensor in base_state.items()}
        applied.append(client.push_state_dict(state, version=version + 1).policy_version)

    completions = generate_while_pushing(server, client, push, [PROMPT], LONG, partial=False)
    assert applied == [version + 1]
    for completion in completions:
        assert completion.token_versions == [version] * len(completion.token_ids)
        assert completion.policy_version == version
