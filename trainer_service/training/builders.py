"""What a job builds from its run config: the device and precision, tokenizer, policy model and GRPOConfig.

Precision as soup-cli's GRPO trainer chooses it (seed/grpo.py.txt): bf16 when the GPU supports it, else fp16
autocast with fp32 weights, fp32 on CPU. 4/8-bit loading goes through bitsandbytes on CUDA only; a PEFT
LoRA/DoRA/rsLoRA adapter is trained unless ``lora.r`` is 0.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import TaskType, get_peft_model, prepare_model_for_kbit_training
from transformers import (
    AutoConfig,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
)
from transformers.trainer_utils import FSDPOption
from trl import GRPOConfig

from grpo_runtime.model_classes import auto_model_class, is_vision_language, vision_processor
from trainer_service.config.run_config import ConfigError, RunConfig
from trainer_service.config.variants import grpo_config_overrides
from trainer_service.rollout.agent_episodes import uses_agent_reward
from trainer_service.rollout.episodes import uses_env_reward


@dataclass(frozen=True)
class Device:
    """Where the trainer computes and in which precision (GRPOConfig ``bf16``/``fp16``; neither = fp32)."""

    type: Literal["cpu", "cuda"]
    bf16: bool = False
    fp16: bool = False

    @classmethod
    def named(cls, type: Literal["cpu", "cuda"]) -> Device:
        """bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
        if type != "cuda":
            return cls(type)
        if torch.cuda.is_bf16_supported():
            return cls(type, bf16=True)
        return cls(type, fp16=True)

    @property
    def fp32(self) -> bool:
        return not (self.bf16 or self.fp16)


def resolve_device(config: RunConfig) -> Device:
    """``training.model.device``, or cuda when available, else cpu."""
    wanted = config.training.model.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("is 'cuda' but no CUDA device is available", key="training.model.device")
    return Device.named(wanted or ("cuda" if torch.cuda.is_available() else "cpu"))


def load_processor(config: RunConfig) -> ProcessorMixin | None:
    """A vision-language base's processor (its image processor and tokenizer, the tokenizer checked as
    :func:`load_tokenizer` checks it); None for a text-only base."""
    processor = vision_processor(config.base)
    if processor is not None:
        processor.tokenizer = _checked_tokenizer(processor.tokenizer)
    return processor


def load_tokenizer(config: RunConfig) -> PreTrainedTokenizerBase:
    return _checked_tokenizer(AutoTokenizer.from_pretrained(config.base))


def _checked_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "the tokenizer has no chat template; GRPO prompts are chat messages (add chat_template.jinja)",
            key="base",
        )
    return tokenizer


def quantization_config(
    config: RunConfig, device: Device, compute_dtype: torch.dtype
) -> BitsAndBytesConfig | None:
    """bitsandbytes 4-bit (NF4, double quantization) or 8-bit loading; CUDA only."""
    mode = config.training.model.quantization
    if mode == "none":
        return None
    if device.type != "cuda":
        raise ConfigError(
            f"is {mode!r}, which needs a CUDA GPU (bitsandbytes); this run is on {device.type}; use 'none'",
            key="training.model.quantization",
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            f"is {mode!r} but bitsandbytes is not installed (extra `quantization`)",
            key="training.model.quantization",
        )
    if config.training.model.lora.r == 0:
        raise ConfigError(
            "quantized weights cannot be trained directly; set training.model.lora.r > 0 (QLoRA)",
            key="training.model.quantization",
        )
    if mode == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def build_model(config: RunConfig, device: Device) -> torch.nn.Module:
    """The policy: base model (optionally quantized) with a PEFT adapter unless ``lora.r`` is 0."""
    t = config.training
    # bf16 weights train fine under bf16 autocast; fp16 AMP needs fp32 master weights, as does CPU.
    dtype = torch.bfloat16 if device.bf16 else torch.float32
    quant = quantization_config(config, device, torch.bfloat16 if device.bf16 else torch.float16)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quant is not None:
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    model = auto_model_class(AutoConfig.from_pretrained(config.base)).from_pretrained(config.base, **kwargs)
    if quant is not None:
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=t.optimizer.gradient_checkpointing
        )
    vision_side = [] if t.model.lora.train_vision_tower else vision_modules(model)
    if t.model.lora.r == 0:
        for name, param in model.named_parameters():
            if _inside(name, vision_side):
                param.requires_grad_(False)
        return model
    adapter = PeftLoraConfig(
        r=t.model.lora.r,
        # PEFT annotates lora_alpha as int, but only divides it by r (or √r): a float α scales the same.
        lora_alpha=t.model.lora.alpha,  # type: ignore[arg-type]
        lora_dropout=t.model.lora.dropout,
        target_modules=t.model.lora.target_modules,
        use_dora=t.model.lora.use_dora,
        use_rslora=t.model.lora.use_rslora,
        bias="none",
        task_type=TaskType.CAUSAL_LM,
        exclude_modules=[name for name, _ in model.named_modules() if _inside(name, vision_side)] or None,
    )
    return get_peft_model(model, adapter)


def _inside(name: str, modules: list[str]) -> bool:
    """Whether parameter or module ``name`` is one of ``modules`` or lies below one."""
    return any(name == module or name.startswith(f"{module}.") for module in modules)


def vision_modules(model: PreTrainedModel) -> list[str]:
    """Names of a vision-language model's top-level modules outside its language model and LM head (the
    vision tower and the projector); empty for a text-only model."""
    if not is_vision_language(model.config):
        return []
    decoder = model.get_decoder()
    inner = next(name for name, module in model.named_modules() if module is decoder)
    parent = inner.rpartition(".")[0]
    siblings = model.get_submodule(parent).named_children() if parent else model.named_children()
    return [f"{parent}.{name}" if parent else name for name, module in siblings if module is not decoder]


# Sharding strategy → FSDP2's ``reshard_after_forward`` (FSDP1 takes any strategy, by name).
_FSDP2_RESHARD = {FSDPOption.FULL_SHARD: True, FSDPOption.SHARD_GRAD_OP: False}


def _fsdp_kwargs(config: RunConfig) -> dict[str, Any]:
    """``training.model.fsdp_config`` → GRPOConfig ``fsdp=True`` and ``fsdp_config``.

    The config's ``fsdp`` key (a strategy string such as ``"full_shard auto_wrap"``, or a list of its words)
    becomes the ``fsdp_config`` entries transformers would derive from it (it deprecates ``fsdp`` as a string
    or a list): ``offload`` → ``cpu_offload``, a sharding strategy → ``reshard_after_forward``, ``auto_wrap``
    → nothing (the default policy wraps). Entries given in ``fsdp_config`` win."""
    raw = config.training.model.fsdp_config
    if not raw:
        return {}
    rest = dict(raw)
    strategy = rest.pop("fsdp", "full_shard auto_wrap")
    words = strategy.split() if isinstance(strategy, str) else strategy
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise ConfigError("a string of FSDP options or a list of them", key="training.model.fsdp_config.fsdp")
    fsdp1 = str(rest.get("version", rest.get("fsdp_version", 2))) == "1"
    for word in words:
        try:
            option = FSDPOption(word)
        except ValueError:
            raise ConfigError(
                f"unknown FSDP option {word!r} (one of {[o.value for o in FSDPOption]})",
                key="training.model.fsdp_config.fsdp",
            ) from None
        if option == FSDPOption.OFFLOAD:
            rest.setdefault("cpu_offload", True)
        elif option == FSDPOption.AUTO_WRAP:
            continue
        elif fsdp1:
            rest.setdefault("reshard_after_forward", option.value)
        elif option in _FSDP2_RESHARD:
            rest.setdefault("reshard_after_forward", _FSDP2_RESHARD[option])
        else:
            raise ConfigError(f"{word!r} needs FSDP1 (version: 1)", key="training.model.fsdp_config.fsdp")
    return {"fsdp": True, "fsdp_config": rest}


def _reward_weights(config: RunConfig) -> list[float] | None:
    """TRL's reward_weights: one per reward term (and the environment's or the agent's reward); None when
    all are 1."""
    rewards = config.training.rewards
    weights = [term.weight for term in rewards.reward_terms]
    if uses_env_reward(config):
        weights.append(rewards.environment_weight)
    elif uses_agent_reward(config):
        assert config.training.agents is not None
        weights.append(config.training.agents.reward_weight)
    return weights if any(w != 1.0 for w in weights) else None


def _resolved_batch_size(config: RunConfig) -> int:
    """``per_device_train_batch_size``, which `resolve_batch_size` has turned from "auto" into a number."""
    size = config.training.optimizer.per_device_train_batch_size
    if size == "auto":
        raise ConfigError(
            "'auto' must be resolved (resolve_batch_size) before the GRPOConfig is built",
            key="training.optimizer.per_device_train_batch_size",
        )
    return size


def build_grpo_config(config: RunConfig, device: Device) -> GRPOConfig:
    """TRL's GRPOConfig from the run config (the variant decides the loss fields); its batch size must be
    resolved (`resolve_batch_size`)."""
    t = config.training
    batch_size = _resolved_batch_size(config)
    overrides = grpo_config_overrides(
        t.loss.variant,
        grpo_delta=t.loss.delta,
        epsilon=t.loss.epsilon,
        epsilon_high=t.loss.epsilon_high,
        params=t.loss.params,
    )
    return GRPOConfig(
        output_dir=str(config.output_dir),
        num_train_epochs=t.num_train_epochs,
        max_steps=t.max_steps,
        learning_rate=t.optimizer.learning_rate,
        lr_scheduler_type=t.optimizer.lr_scheduler_type,
        # transformers ≥ 5 reads a float < 1 as a fraction of the training steps.
        warmup_steps=t.optimizer.warmup_ratio,
        weight_decay=t.optimizer.weight_decay,
        max_grad_norm=t.optimizer.max_grad_norm,
        optim=t.optimizer.optim,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        gradient_accumulation_steps=t.optimizer.gradient_accumulation_steps,
        num_generations=t.generation.num_generations,
        beta=t.loss.beta,
        scale_rewards=t.loss.scale_rewards,
        mask_truncated_completions=t.loss.mask_truncated_completions,
        # The trainer recomputes logprobs as log_softmax(logits / temperature): must equal the sampling T.
        temperature=t.generation.temperature,
        top_p=t.generation.top_p,
        top_k=t.generation.top_k or 0,
        min_p=t.generation.min_p,
        max_completion_length=t.generation.max_completion_length,
        reward_weights=_reward_weights(config),
        logging_steps=t.logging_steps,
        save_strategy="steps" if t.save_steps else "no",
        save_steps=t.save_steps or 500,
        save_total_limit=t.save_total_limit,
        # Held-out evaluation is the job's own (greedy + pass@k through the services, training.evaluation).
        eval_strategy="no",
        seed=t.seed,
        data_seed=t.seed,
        report_to=t.report_to,
        # Dataset columns (answer, tests, ...) must reach the reward functions.
        remove_unused_columns=False,
        use_cpu=device.type == "cpu",
        bf16=device.bf16,
        fp16=device.fp16,
        gradient_checkpointing=t.optimizer.gradient_checkpointing,
        deepspeed=t.model.deepspeed,
        **_fsdp_kwargs(config),
        disable_tqdm=True,
        log_completions=False,
        # "auto" may still skip it batch by batch (importance_sampling_plan); "off" never computes it.
        vllm_importance_sampling_correction=t.loss.importance_sampling != "off",
        **overrides,
    )
