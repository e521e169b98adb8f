"""Which transformers auto class loads a policy: a causal LM, or an image-text-to-text model.

A vision-language checkpoint (LLaVA, Gemma 3, Qwen2-VL, ...) has a ``vision_config`` beside its text config
and is loaded by ``AutoModelForImageTextToText`` with an ``AutoProcessor`` (image processor + tokenizer);
every other policy is a causal LM with a tokenizer. The rollout and trainer services decide the same way.
"""

from __future__ import annotations

from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    ProcessorMixin,
)
from transformers.models.auto.auto_factory import _BaseAutoModelClass
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)


def is_vision_language(config: PretrainedConfig) -> bool:
    """Whether ``config`` is an image-text-to-text model with a vision tower."""
    return (
        config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        and getattr(config, "vision_config", None) is not None
    )


def is_generative(config: PretrainedConfig) -> bool:
    """Whether ``config`` names a model that generates text: a causal LM or a vision-language model."""
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or is_vision_language(config)


def generating_architectures() -> set[str]:
    """Class names of every causal LM and image-text-to-text model (a checkpoint's ``architectures``)."""
    names = (
        *MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values(),
        *MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values(),
    )
    return {name for entry in names for name in ((entry,) if isinstance(entry, str) else entry)}


def auto_model_class(config: PretrainedConfig) -> type[_BaseAutoModelClass]:
    """``AutoModelForImageTextToText`` for a vision-language config, else ``AutoModelForCausalLM``."""
    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def vision_processor(model_dir: str) -> ProcessorMixin | None:
    """A vision-language model's processor (its image processor and tokenizer); None for any other model."""
    if not is_vision_language(AutoConfig.from_pretrained(model_dir)):
        return None
    return AutoProcessor.from_pretrained(model_dir)


def load_processing(model_dir: str) -> tuple[PreTrainedTokenizerBase, ProcessorMixin | None]:
    """The model's tokenizer and, for a vision-language model, its processor (whose tokenizer that is)."""
    processor = vision_processor(model_dir)
    if processor is None:
        return AutoTokenizer.from_pretrained(model_dir), None
    return processor.tokenizer, processor


def image_placeholder(processor: ProcessorMixin) -> tuple[str, int]:
    """A vision-language processor's image placeholder: the text a chat template writes for an image part
    (``<image>`` for LLaVA), which the processor expands to the image's tokens, and that token's id.
    ValueError when the processor declares none (an architecture whose processor names it otherwise)."""
    text, token_id = getattr(processor, "image_token", None), getattr(processor, "image_token_id", None)
    if not isinstance(text, str) or not isinstance(token_id, int):
        raise ValueError(f"{type(processor).__name__} declares no image_token / image_token_id")
    return text, token_id
