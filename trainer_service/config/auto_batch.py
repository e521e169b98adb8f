"""``per_device_train_batch_size: auto``: the completions per device per micro-step that fit in memory.

The trainer holds the weights, the trainable state and, per completion of the micro-batch, the activations
its backward needs. With P parameters of which T train, ``b`` bytes per weight (2 for bf16/fp16 weights, 4
for fp32), hidden size h, L layers, vocabulary V, prompt length p and completion length c tokens:

    fixed          = P·b + T·(b + 8) [+ P·b]       weights; gradients (b) and Adam's two fp32 moments (8) of
                                                    the trainable ones; [a reference copy: full fine-tuning
                                                    with β > 0]
    per_completion = (p + c)·L·a·h + c·V·(b + 8)    activations kept for backward, a = 17·b bytes per hidden
                                                    unit per token and layer (Korthikanti et al. 2022,
                                                    arXiv:2205.05198: 34·h bytes at 16 bit), 2·b with
                                                    gradient checkpointing (only each layer's input); the
                                                    completion's logits (b), their fp32 log-softmax and its
                                                    gradient (8)
    fits           = ⌊(MEMORY_FRACTION · available − fixed) / per_completion⌋

MEMORY_FRACTION (0.5) leaves room for the allocator, the optimizer's temporaries, the CUDA context or, on
CPU, everything else on the machine. The batch is then capped at MAX_AUTO_BATCH_SIZE and rounded DOWN to
TRL's rule: ``generation_batch_size = batch_size × processes × gradient_accumulation_steps`` must be a
multiple of G (``GRPOConfig.__post_init__``), so ``batch_size`` must be a multiple of
``unit = G / gcd(G, processes × gradient_accumulation_steps)``. Less room than one unit is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MEMORY_FRACTION = 0.5
# More completions per micro-step mostly lengthen the step; raise gradient_accumulation_steps instead.
MAX_AUTO_BATCH_SIZE = 64
# Bytes of activations per hidden unit, token and layer, per byte of the compute dtype.
ACTIVATION_FACTOR = 17
CHECKPOINTED_ACTIVATION_FACTOR = 2
# Per trainable weight beyond the weight: Adam's exp_avg and exp_avg_sq in fp32.
ADAM_STATE_BYTES = 8


class AutoBatchError(ValueError):
    """Not even the smallest batch TRL accepts fits in the memory available."""


@dataclass(frozen=True)
class BatchSizingInputs:
    """What the choice depends on; sizes in elements, memory in bytes, lengths in tokens."""

    available_bytes: int
    parameters: int
    trainable_parameters: int
    weight_bytes: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    prompt_tokens: int
    completion_tokens: int
    num_generations: int
    gradient_accumulation_steps: int = 1
    processes: int = 1
    gradient_checkpointing: bool = False
    reference_copy: bool = False


@dataclass(frozen=True)
class BatchSizeChoice:
    """The chosen ``batch_size`` and the numbers behind it (module docstring)."""

    batch_size: int
    fits: int
    unit: int
    fixed_bytes: int
    per_completion_bytes: int
    budget_bytes: int

    def describe(self) -> str:
        gib = 1024**3
        return (
            f"per_device_train_batch_size auto = {self.batch_size} completions per device per micro-step "
            f"(a multiple of {self.unit}, at most {MAX_AUTO_BATCH_SIZE}): {self.fits} fit in "
            f"{self.budget_bytes / gib:.2f} GiB ({MEMORY_FRACTION:.0%} of the available memory less "
            f"{self.fixed_bytes / gib:.3f} GiB of weights and optimizer state) at "
            f"{self.per_completion_bytes / 2**20:.2f} MiB per completion"
        )


def divisibility_unit(num_generations: int, processes: int, gradient_accumulation_steps: int) -> int:
    """The smallest per-device batch TRL accepts, and the step between accepted ones."""
    return num_generations // math.gcd(num_generations, processes * gradient_accumulation_steps)


def choose_batch_size(inputs: BatchSizingInputs) -> BatchSizeChoice:
    """The largest batch that fits (module docstring), rounded down to TRL's divisibility rule."""
    b = inputs.weight_bytes
    fixed = inputs.parameters * b + inputs.trainable_parameters * (b + ADAM_STATE_BYTES)
    if inputs.reference_copy:
        fixed += inputs.parameters * b
    factor = CHECKPOINTED_ACTIVATION_FACTOR if inputs.gradient_checkpointing else ACTIVATION_FACTOR
    tokens = inputs.prompt_tokens + inputs.completion_tokens
    per_completion = tokens * inputs.num_layers * factor * b * inputs.hidden_size + (
        inputs.completion_tokens * inputs.vocab_size * (b + ADAM_STATE_BYTES)
    )
    budget = int(MEMORY_FRACTION * inputs.available_bytes) - fixed
    fits = max(budget, 0) // per_completion
    unit = divisibility_unit(inputs.num_generations, inputs.processes, inputs.gradient_accumulation_steps)
    batch = min(fits, MAX_AUTO_BATCH_SIZE) // unit * unit
    if batch < unit:
        raise AutoBatchError(
            f"auto found room for {fits} completions per micro-step ({max(budget, 0) / 2**30:.2f} GiB "
            f"after the weights and optimizer state, {per_completion / 2**20:.1f} MiB per completion), but "
            f"TRL needs a multiple of {unit} (num_generations / gcd(num_generations, processes × "
            "gradient_accumulation_steps)); set per_device_train_batch_size explicitly, enable "
            "gradient_checkpointing or shorten the completions"
        )
    return BatchSizeChoice(batch, fits, unit, fixed, per_completion, budget)
