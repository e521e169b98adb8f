"""Per-row logits processing and sampling for the HF engine's decode loop.

Rows of one batch may carry different sampling parameters (they come from different Generate
calls), so every processor takes per-row tensors. The order follows vLLM's sampler, so both
engines sample the same distribution:

1. repetition penalty (CTRL, Keskar et al. 2019) on raw logits z of tokens already seen
   (prompt and completion): z ← z / θ if z > 0 else z · θ;
2. min_tokens: EOS gets −inf while fewer than ``min_tokens`` tokens were generated;
3. temperature: z ← z / T (greedy rows, T = 0, take the argmax instead of sampling);
4. min_p: drop tokens with p < min_p · max p;
5. top_k, then top_p (nucleus: keep the smallest prefix of tokens sorted by p whose mass
   reaches top_p, at least one token);
6. sample with a per-row ``torch.Generator``: argmax(p / E), E ~ Exp(1) (the exponential race,
   which draws exactly from p and needs one generator call per row).

The returned logprob of the sampled token is that of TRL's recomputation,
``log_softmax(z_raw / T)`` (T = 1 for greedy rows) — before penalties, min_tokens and the
top-k/top-p/min-p filters — so the trainer's importance ratio starts at exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors of shape (B,)."""

    temperature: torch.Tensor  # float, 0 = greedy
    top_k: torch.Tensor  # long, 0 = off
    top_p: torch.Tensor  # float, 1 = off
    min_p: torch.Tensor  # float, 0 = off
    repetition_penalty: torch.Tensor  # float, 1 = off
    min_tokens: torch.Tensor  # long

    @property
    def any_penalty(self) -> bool:
        return bool((self.repetition_penalty != 1).any())


def tempered_logprobs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) over the vocabulary, T = 1 where T = 0. Shapes (B, V), (B,)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return torch.log_softmax(logits / t[:, None], dim=-1)


def sampling_logits(
    logits: torch.Tensor,
    params: RowParams,
    seen: torch.Tensor | None,
    num_generated: int,
    eos_ids: list[int],
) -> torch.Tensor:
    """Steps 1–5 above: the logits the next token is drawn from (−inf = excluded). (B, V) fp32."""
    z = logits.clone()
    if seen is not None:
        theta = params.repetition_penalty[:, None]
        penalised = torch.where(z > 0, z / theta, z * theta)
        z = torch.where(seen, penalised, z)
    if eos_ids:
        blocked = params.min_tokens > num_generated
        if blocked.any():
            rows = blocked.nonzero(as_tuple=True)[0]
            z[rows[:, None], torch.tensor(eos_ids)[None, :]] = float("-inf")
    t = torch.where(params.temperature > 0, params.temperature, torch.ones_like(params.temperature))
    z = z / t[:, None]
    if (params.min_p > 0).any():
        probs = torch.softmax(z, dim=-1)
        threshold = params.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        z = z.masked_fill(probs < threshold, float("-inf"))
    if (params.top_k > 0).any():
        vocab = z.shape[-1]
        k = torch.where(params.top_k > 0, params.top_k.clamp(max=vocab), torch.full_like(params.top_k, vocab))
        sorted_desc = torch.sort(z, dim=-1, descending=True).values
        kth = sorted_desc.gather(-1, (k - 1)[:, None])
        z = z.masked_fill(z < kth, float("-inf"))
    if (params.top_p < 1).any():
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_z, dim=-1)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        drop_sorted = mass_before >= params.top_p[:, None]
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def sample_rows(z: torch.Tensor, params: RowParams, generators: list[torch.Generator]) -> torch.Tensor:
    """Step 6: one token per row (argmax for greedy rows). Returns (B,) long."""
    greedy = params.temperature <= 0
    probs = torch.softmax(z, dim=-1)
    noise = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        noise[row].exponential_(generator=generator)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(greedy, z.argmax(dim=-1), sampled)
