"""Loading a reward model and its tokenizer from a local ``save_pretrained`` directory.

Validation happens before any weights are read, so a bad request costs nothing: the device must
exist, the dtype must be known, ``config.json`` must name an architecture that fits the requested
kind, and remote code runs only when both the request and the server settings allow it. Errors are
``InvalidArgument`` naming the field at fault (``device``, ``dtype``, ``path``, ``kind``,
``prm_format``, ``trust_remote_code``, ``step_token``, ``judge_template``, ...).

``load_model`` is blocking (seconds for real models); the registry runs it in a worker thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from grpo_runtime.errors import InvalidArgument
from reward_service.judges.template import judge_templates
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import (
    DEFAULT_JUDGE_NEGATIVE_TOKEN,
    DEFAULT_JUDGE_POSITIVE_TOKEN,
    DEFAULT_NEGATIVE_TOKEN,
    DEFAULT_POSITIVE_TOKEN,
    DEFAULT_STEP_SEPARATOR,
    DEFAULT_STEP_TAG,
    ModelKind,
    ModelSpec,
    PrmFormat,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Architecture name suffixes accepted for each model format (config.json ``architectures``).
# ``ForProcessRewardModel`` is Qwen2.5-Math-PRM's remote-code class: a 2-class per-token head.
_TOKEN_CLASSIFICATION_SUFFIXES = ("ForTokenClassification", "ForProcessRewardModel")
_STEP_TAG_SUFFIXES = ("ForCausalLM",)
_SEQUENCE_CLASSIFICATION_SUFFIXES = ("ForSequenceClassification",)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference, with everything resolved (no defaults left)."""

    spec: ModelSpec
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    prm_format: PrmFormat | None  # None for ORMs and judges
    device: str
    dtype: str
    max_positions: int  # longest sequence accepted, in tokens
    pad_token_id: int
    step_token: str = ""  # PRM: separator (token classification) or tag (step tag)
    step_token_id: int | None = None
    positive_token_id: int | None = None  # step tag: '+'; judge: 'Yes'
    negative_token_id: int | None = None  # step tag: '-'; judge: 'No'

    def token_pair(self) -> tuple[int, int]:
        """(positive, negative) verdict token ids: set for a step-tag PRM and a judge."""
        if self.positive_token_id is None or self.negative_token_id is None:
            raise ValueError(f"{self.spec.path} is read through no verdict token pair")
        return self.positive_token_id, self.negative_token_id


def resolve_device(requested: str | None, settings: ModelSettings) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; CUDA must be present and N in range."""
    device = requested or settings.device
    if device == "cpu":
        return device
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise InvalidArgument(f"{device!r} requested but CUDA is not available here", field="device")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise InvalidArgument(
                f"{device!r}: there are {torch.cuda.device_count()} CUDA devices", field="device"
            )
        return device
    raise InvalidArgument(f"{device!r} is not one of cpu, cuda, cuda:N", field="device")


def resolve_dtype(requested: str | None, settings: ModelSettings) -> str:
    dtype = requested or settings.dtype
    if dtype not in DTYPES:
        raise InvalidArgument(f"{dtype!r} is not one of {', '.join(DTYPES)}", field="dtype")
    return dtype


def read_architectures(path: str) -> list[str]:
    """The ``architectures`` of ``path/config.json``; InvalidArgument(path) when unreadable."""
    directory = Path(path)
    if not path or not directory.is_dir():
        raise InvalidArgument(f"{path!r} is not a directory on the server", field="path")
    config_file = directory / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot read {config_file}: {exc}", field="path") from exc
    architectures = config.get("architectures") or []
    if not architectures:
        raise InvalidArgument(f"{config_file} names no architectures", field="path")
    return list(architectures)


def _matches(architectures: list[str], suffixes: tuple[str, ...]) -> bool:
    return any(arch.endswith(suffixes) for arch in architectures)


def resolve_format(spec: ModelSpec, architectures: list[str]) -> PrmFormat | None:
    """The model's input format, checked against its architecture.

    ORM: a sequence-classification head. Judge: a causal LM. PRM: token classification
    (Qwen2.5-Math-PRM) or a causal LM read at a step tag (Math-Shepherd); AUTO picks by architecture.
    """
    if spec.kind is ModelKind.JUDGE:
        if not _matches(architectures, _STEP_TAG_SUFFIXES):
            raise InvalidArgument(
                f"a judge needs a ...ForCausalLM model, {spec.path} is {architectures}", field="kind"
            )
        return None
    if spec.kind is ModelKind.ORM:
        if not _matches(architectures, _SEQUENCE_CLASSIFICATION_SUFFIXES):
            raise InvalidArgument(
                f"an ORM needs a ...ForSequenceClassification model, {spec.path} is {architectures}",
                field="kind",
            )
        return None
    fmt = spec.prm_format
    if fmt is PrmFormat.AUTO:
        if _matches(architectures, _TOKEN_CLASSIFICATION_SUFFIXES):
            return PrmFormat.TOKEN_CLASSIFICATION
        if _matches(architectures, _STEP_TAG_SUFFIXES):
            return PrmFormat.STEP_TAG
        raise InvalidArgument(
            f"a PRM needs a token-classification model or a causal LM, {spec.path} is {architectures}",
            field="kind",
        )
    wanted = _TOKEN_CLASSIFICATION_SUFFIXES if fmt is PrmFormat.TOKEN_CLASSIFICATION else _STEP_TAG_SUFFIXES
    if not _matches(architectures, wanted):
        raise InvalidArgument(
            f"format {fmt.value} needs a ...{wanted[0]} model, {spec.path} is {architectures}",
            field="prm_format",
        )
    return fmt


def single_token_id(tokenizer: PreTrainedTokenizerBase, token: str, field: str) -> int:
    """Id of ``token``: the last id of its encoding, as Math-Shepherd takes ``encode("ки")[-1]``."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if not ids:
        raise InvalidArgument(f"{token!r} encodes to no token", field=field)
    return ids[-1]


def verdict_token_id(tokenizer: PreTrainedTokenizerBase, token: str, field: str) -> int:
    """Id of a judge's verdict token, which must encode to exactly one id (its probability is read at
    one position; the last piece of a multi-token word would be a different question)."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise InvalidArgument(
            f"{token!r} encodes to {len(ids)} tokens {ids}; a verdict must be a single token", field=field
        )
    return ids[0]


def _auto_class(kind: ModelKind, fmt: PrmFormat | None, architectures: list[str]):
    if kind is ModelKind.JUDGE:
        return AutoModelForCausalLM
    if fmt is None:
        return AutoModelForSequenceClassification
    if fmt is PrmFormat.STEP_TAG:
        return AutoModelForCausalLM
    if _matches(architectures, ("ForTokenClassification",)):
        return AutoModelForTokenClassification
    # Remote-code PRM heads (Qwen2ForProcessRewardModel) register under AutoModel only.
    return AutoModel


def load_model(spec: ModelSpec, settings: ModelSettings) -> LoadedModel:
    """Validate ``spec`` and load the model in eval mode on its device (blocking)."""
    device = resolve_device(spec.device, settings)
    dtype = resolve_dtype(spec.dtype, settings)
    if spec.trust_remote_code and not settings.allow_trust_remote_code:
        raise InvalidArgument(
            "remote code is disabled on this server (models.allow_trust_remote_code)",
            field="trust_remote_code",
        )
    if spec.kind is ModelKind.JUDGE:
        judge_templates(spec.judge_template, spec.judge_group_template)  # a bad template fails here
    architectures = read_architectures(spec.path)
    fmt = resolve_format(spec, architectures)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)
        model = _auto_class(spec.kind, fmt, architectures).from_pretrained(
            spec.path, dtype=DTYPES[dtype], trust_remote_code=spec.trust_remote_code
        )
    except Exception as exc:  # whatever the files hold (missing, truncated, foreign), it is the path's fault
        raise InvalidArgument(f"cannot load a model from {spec.path!r}: {exc}", field="path") from exc
    model = model.to(device).eval()

    # Batching needs a pad token; like TRL, fall back to EOS and tell the model (sequence
    # classification pools the last non-pad token, found through config.pad_token_id).
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise InvalidArgument(f"the tokenizer in {spec.path!r} has no pad or eos token", field="path")
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id

    limits = [
        limit
        for limit in (getattr(model.config, "max_position_embeddings", None), settings.max_sequence_tokens)
        if limit
    ]
    loaded = {
        "spec": spec,
        "model": model,
        "tokenizer": tokenizer,
        "prm_format": fmt,
        "device": device,
        "dtype": dtype,
        "max_positions": min(limits) if limits else tokenizer.model_max_length,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if fmt is PrmFormat.TOKEN_CLASSIFICATION:
        num_labels = getattr(model.config, "num_labels", 2)
        if num_labels < 2:
            raise InvalidArgument(f"token classification needs 2 labels, not {num_labels}", field="kind")
        loaded["step_token"] = spec.step_token or DEFAULT_STEP_SEPARATOR
        loaded["step_token_id"] = single_token_id(tokenizer, loaded["step_token"], "step_token")
    elif fmt is PrmFormat.STEP_TAG:
        loaded["step_token"] = spec.step_token or DEFAULT_STEP_TAG
        loaded["step_token_id"] = single_token_id(tokenizer, loaded["step_token"], "step_token")
        loaded["positive_token_id"] = single_token_id(
            tokenizer, spec.positive_token or DEFAULT_POSITIVE_TOKEN, "positive_token"
        )
        loaded["negative_token_id"] = single_token_id(
            tokenizer, spec.negative_token or DEFAULT_NEGATIVE_TOKEN, "negative_token"
        )
    elif spec.kind is ModelKind.JUDGE:
        loaded["positive_token_id"] = verdict_token_id(
            tokenizer, spec.positive_token or DEFAULT_JUDGE_POSITIVE_TOKEN, "positive_token"
        )
        loaded["negative_token_id"] = verdict_token_id(
            tokenizer, spec.negative_token or DEFAULT_JUDGE_NEGATIVE_TOKEN, "negative_token"
        )
    if (
        loaded.get("positive_token_id") is not None
        and loaded["positive_token_id"] == loaded["negative_token_id"]
    ):
        raise InvalidArgument("positive and negative tokens share one id", field="negative_token")
    return LoadedModel(**loaded)
