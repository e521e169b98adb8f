"""Measures what ``per_device_train_batch_size: auto`` needs (:mod:`trainer_service.config.auto_batch`
has the arithmetic).

Memory: free CUDA memory on the training device (``torch.cuda.mem_get_info``, which already excludes what a
rollout engine on the same GPU holds) or the available RAM on CPU (``psutil``). Model size: the base model
built on the ``meta`` device from its config (no weights are read), so the count is exact and costs no
memory; the LoRA adapter's trainable parameters are counted from the linear layers it targets,
r·(in + out) each (+ out for DoRA's magnitude), as PEFT creates them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import psutil
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from trainer_service.config.auto_batch import BatchSizeChoice, BatchSizingInputs, choose_batch_size
from trainer_service.config.run_config import ConfigError, RunConfig
from trainer_service.training.builders import Device

log = logging.getLogger(__name__)

# Prompt + completion tokens assumed when the config bounds only the completion (soup-cli's max_length).
ASSUMED_SEQUENCE_TOKENS = 512


@dataclass(frozen=True)
class ModelShape:
    """Sizes of the policy that the batch choice depends on."""

    parameters: int
    trainable_parameters: int
    hidden_size: int
    num_layers: int
    vocab_size: int


def _lora_parameters(model: PreTrainedModel, config: RunConfig) -> int:
    lora = config.training.model.lora
    output = model.get_output_embeddings()
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output:
            continue
        targets = lora.target_modules
        if targets != "all-linear" and name.rsplit(".", 1)[-1] not in targets and name not in targets:
            continue
        total += lora.r * (module.in_features + module.out_features)
        if lora.use_dora:
            total += module.out_features
    return total


def model_shape(config: RunConfig) -> ModelShape:
    """The base model's parameter count and dimensions, and what this run trains of it."""
    model_config = AutoConfig.from_pretrained(config.base)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    parameters = sum(p.numel() for p in model.parameters())
    r = config.training.model.lora.r
    trainable = parameters if r == 0 else _lora_parameters(model, config)
    text = model_config.get_text_config()
    return ModelShape(parameters, trainable, text.hidden_size, text.num_hidden_layers, text.vocab_size)


def available_memory(device: Device) -> int:
    """Bytes free for the trainer: on the CUDA device it trains on, or RAM on CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", "0")))
        return int(free)
    return int(psutil.virtual_memory().available)


def sizing_inputs(config: RunConfig, device: Device, available_bytes: int | None = None) -> BatchSizingInputs:
    """The inputs of the choice for this run on ``device`` (memory measured unless given)."""
    t = config.training
    shape = model_shape(config)
    completion = config.training.generation.max_completion_length
    # Without data.max_prompt_length, assume prompt + completion = ASSUMED_SEQUENCE_TOKENS, or a prompt that
    # long when the completion alone fills it.
    prompt = config.data.max_prompt_length or ASSUMED_SEQUENCE_TOKENS - completion
    if prompt <= 0:
        prompt = ASSUMED_SEQUENCE_TOKENS
    quantized = t.model.quantization != "none"
    return BatchSizingInputs(
        available_bytes=available_memory(device) if available_bytes is None else available_bytes,
        parameters=shape.parameters,
        trainable_parameters=shape.trainable_parameters,
        weight_bytes=2 if device.bf16 or quantized else 4,
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        vocab_size=shape.vocab_size,
        prompt_tokens=prompt,
        completion_tokens=completion,
        num_generations=t.generation.num_generations,
        gradient_accumulation_steps=t.optimizer.gradient_accumulation_steps,
        processes=int(os.environ.get("WORLD_SIZE", "1")),
        gradient_checkpointing=t.optimizer.gradient_checkpointing,
        reference_copy=t.model.lora.r == 0 and t.loss.beta > 0,
    )


def resolve_batch_size(
    config: RunConfig, device: Device, available_bytes: int | None = None
) -> tuple[RunConfig, BatchSizeChoice | None]:
    """``config`` with ``per_device_train_batch_size: auto`` replaced by the chosen size (logged), and the
    choice; a config with a number is returned as it is, with None. Errors name
    ``training.optimizer.per_device_train_batch_size``."""
    if config.training.optimizer.per_device_train_batch_size != "auto":
        return config, None
    try:
        choice = choose_batch_size(sizing_inputs(config, device, available_bytes))
    except ValueError as exc:
        raise ConfigError(str(exc), key="training.optimizer.per_device_train_batch_size") from exc
    log.info("%s", choice.describe())
    optimizer = config.training.optimizer.model_copy(
        update={"per_device_train_batch_size": choice.batch_size}
    )
    training = config.training.model_copy(update={"optimizer": optimizer})
    return config.model_copy(update={"training": training}), choice
