"""The HF engine's per-row logits processors and sampler."""

from __future__ import annotations

import torch

from rollout_service.engines.sampling import RowParams, sample_rows, sampling_logits, tempered_logprobs


def params(b: int, **kw) -> RowParams:
    base = {
        "temperature": torch.ones(b),
        "top_k": torch.zeros(b, dtype=torch.long),
        "top_p": torch.ones(b),
        "min_p": torch.zeros(b),
        "repetition_penalty": torch.ones(b),
        "min_tokens": torch.zeros(b, dtype=torch.long),
    }
    base.update(kw)
    return RowParams(**base)


LOGITS = torch.tensor([[4.0, 3.0, 2.0, 1.0, -1.0], [4.0, 3.0, 2.0, 1.0, -1.0]])


def kept(z: torch.Tensor) -> list[list[int]]:
    return [torch.isfinite(row).nonzero().flatten().tolist() for row in z]


def test_per_row_filters():
    p = params(2, top_k=torch.tensor([2, 0]), top_p=torch.tensor([1.0, 0.9]))
    assert kept(sampling_logits(LOGITS, p, None, 0, [])) == [[0, 1], [0, 1, 2]]
    p = params(2, min_p=torch.tensor([0.3, 0.0]))
    assert kept(sampling_logits(LOGITS, p, None, 0, [])) == [[0, 1], [0, 1, 2, 3, 4]]


def test_repetition_penalty_and_min_tokens():
    seen = torch.tensor([[True, False, False, False, True], [False] * 5])
    p = params(2, repetition_penalty=torch.tensor([2.0, 2.0]), min_tokens=torch.tensor([3, 0]))
    z = sampling_logits(LOGITS, p, seen, 1, [3])
    assert z[0].tolist()[:3] == [2.0, 3.0, 2.0] and z[0, 3] == float("-inf") and z[0, 4] == -2.0
    assert z[1].tolist() == LOGITS[1].tolist()


def test_temperature_logprobs_are_trl_definition():
    t = torch.tensor([0.5, 0.0])
    lp = tempered_logprobs(LOGITS, t)
    assert torch.allclose(lp[0], torch.log_softmax(LOGITS[0] / 0.5, -1))
    assert torch.allclose(lp[1], torch.log_softmax(LOGITS[1], -1))  # greedy: untempered


def test_sampler_draws_from_the_distribution_and_greedy_is_argmax():
    rows = 3000
    temperature = torch.ones(rows)
    temperature[0] = 0.0
    p = params(rows, temperature=temperature)
    z = sampling_logits(LOGITS[:1].expand(rows, -1), p, None, 0, [])
    generators = [torch.Generator().manual_seed(seed) for seed in range(rows)]
    tokens = sample_rows(z, p, generators)
    assert tokens[0] == 0  # greedy row
    counts = torch.bincount(tokens[1:], minlength=5).float()
    assert torch.allclose(counts / counts.sum(), torch.softmax(LOGITS[0], -1), atol=0.03)
    again = sample_rows(z, p, [torch.Generator().manual_seed(seed) for seed in range(rows)])
    assert torch.equal(tokens, again)  # per-row seeds reproduce
