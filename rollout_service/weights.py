"""Weight payloads: safetensors parsing, checksum, validation against the model, LoRA deltas.

A weight update is either a PEFT LoRA adapter (``adapter_model.safetensors`` tensors named
``base_model.model.<module>.lora_A.weight`` / ``.lora_B.weight`` plus ``adapter_config.json``)
or a full/partial state dict of the base model (names as in the model's ``state_dict()``).
Everything here runs *before* anything touches the live engine, so a bad update is refused
with INVALID_ARGUMENT naming the field and the previous weights keep serving.

LoRA on a linear layer with weight W0 (out × in): W = W0 + s · B @ A, with A (r × in),
B (out × r) and s = lora_alpha / r (``use_rslora``: lora_alpha / sqrt(r)).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from grpo_runtime.errors import InvalidArgument
from rollout_service.core import payload as codec
from rollout_service.core.types import WeightFormat, WeightPayload

PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class ParamCatalog:
    """Names → shapes of the base model's parameters and buffers in ``state_dict()`` naming.

    Built from a meta-device instance of the model's config, so it costs no memory and works
    for engines (vLLM) that do not hold an HF module in this process.
    """

    shapes: dict[str, tuple[int, ...]]

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ParamCatalog:
        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return cls({name: tuple(t.shape) for name, t in model.state_dict().items()})


@dataclass(frozen=True)
class LoraAdapter:
    """A validated LoRA adapter.

    ``modules``: base-model module name (``model.layers.0.self_attn.q_proj``) → (A, B, scale).
    ``tensors`` / ``config``: the adapter as PEFT saved it, for engines that load adapters
    themselves (vLLM).
    """

    modules: dict[str, tuple[torch.Tensor, torch.Tensor, float]]
    tensors: dict[str, torch.Tensor]
    config: dict

    @property
    def rank(self) -> int:
        return max(a.shape[0] for a, _, _ in self.modules.values())

    def delta(self, module: str) -> torch.Tensor:
        """s · B @ A for one module, shape (out, in), fp32."""
        a, b, scale = self.modules[module]
        return scale * (b.float() @ a.float())

    def write_dir(self, directory: Path) -> Path:
        """Write the adapter as a PEFT directory (what vLLM's LoRARequest loads)."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ADAPTER_CONFIG).write_text(json.dumps(self.config))
        with (directory / ADAPTER_WEIGHTS).open("wb") as out:
            out.writelines(codec.encode(self.tensors).parts)
        return directory


@dataclass(frozen=True)
class ValidatedUpdate:
    """A weight update that passed every check; exactly one of ``lora`` / ``state_dict`` is set."""

    version: int
    format: WeightFormat
    lora: LoraAdapter | None = None
    state_dict: dict[str, torch.Tensor] | None = None
    nbytes: int = 0

    @property
    def num_tensors(self) -> int:
        if self.lora is not None:
            return len(self.lora.tensors)
        return len(self.state_dict or {})


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity in a CPU float tensor.

    Done with numpy (single-threaded, one pass): torch's parallel reduction spins its OpenMP
    threads, which on a busy machine costs tens of times the pass itself. bfloat16, which numpy
    lacks, is checked on its bits: exponent all ones (0x7F80) means inf or NaN.
    """
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bfloat16:
        bits = flat.view(torch.int16).numpy()
        return not bool(((bits & 0x7F80) == 0x7F80).any())
    return bool(np.isfinite(flat.numpy()).all())


def parse_safetensors(data: bytes | bytearray | memoryview, field: str = "data") -> dict[str, torch.Tensor]:
    """Decode one safetensors file; corrupt bytes → InvalidArgument(field). The tensors are
    views into ``data`` when it is writable (the receive buffer), else into one copy of it."""
    return codec.parse(data, field=field)


def validate_payload(payload: WeightPayload, catalog: ParamCatalog) -> ValidatedUpdate:
    """Check size, checksum, bytes, names and shapes of a streamed update.

    The checksum is the one the receiver computed while the chunks arrived
    (``payload.received_sha256``), or computed here when it did not.
    """
    if payload.format == WeightFormat.UNSPECIFIED:
        raise InvalidArgument("must be LORA_ADAPTER or STATE_DICT", field="format")
    if payload.total_bytes and payload.total_bytes != len(payload.data):
        raise InvalidArgument(
            f"declared {payload.total_bytes} bytes, received {len(payload.data)}", field="total_bytes"
        )
    if not payload.sha256:
        raise InvalidArgument("the SHA-256 of the payload is required", field="sha256")
    actual = payload.received_sha256 or sha256_hex(payload.data)
    if payload.sha256.lower() != actual:
        raise InvalidArgument(f"checksum mismatch: declared {payload.sha256}, got {actual}", field="sha256")
    tensors = parse_safetensors(payload.data)
    return validate_tensors(
        payload.version, payload.format, tensors, payload.adapter_config_json, catalog, len(payload.data)
    )


def validate_tensors(
    version: int,
    fmt: WeightFormat,
    tensors: dict[str, torch.Tensor],
    adapter_config_json: str,
    catalog: ParamCatalog,
    nbytes: int = 0,
) -> ValidatedUpdate:
    """Validate parsed tensors of either format against the model's parameters."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise InvalidArgument(f"tensor {name!r} has dtype {tensor.dtype}, expected a float", field="data")
        if not all_finite(tensor):
            raise InvalidArgument(f"tensor {name!r} holds NaN or infinite values", field="data")
    if fmt == WeightFormat.LORA_ADAPTER:
        lora = _validate_lora(tensors, adapter_config_json, catalog)
        return ValidatedUpdate(version, fmt, lora=lora, nbytes=nbytes)
    if fmt == WeightFormat.STATE_DICT:
        for name, tensor in tensors.items():
            expected = catalog.shapes.get(name)
            if expected is None:
                raise InvalidArgument(f"unknown parameter name {name!r}", field="data")
            if tuple(tensor.shape) != expected:
                raise InvalidArgument(
                    f"parameter {name!r} has shape {list(tensor.shape)}, the model has {list(expected)}",
                    field="data",
                )
        return ValidatedUpdate(version, fmt, state_dict=tensors, nbytes=nbytes)
    raise InvalidArgument("must be LORA_ADAPTER or STATE_DICT", field="format")


def _validate_lora(
    tensors: dict[str, torch.Tensor], adapter_config_json: str, catalog: ParamCatalog
) -> LoraAdapter:
    field = "adapter_config_json"
    if not adapter_config_json:
        raise InvalidArgument("required for a LoRA adapter", field=field)
    try:
        config = json.loads(adapter_config_json)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"not valid JSON ({exc.msg})", field=field) from exc
    if not isinstance(config, dict):
        raise InvalidArgument("must be a JSON object", field=field)
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidArgument(f"peft_type {config.get('peft_type')!r} is not LORA", field=field)
    if config.get("use_dora"):
        raise InvalidArgument("DoRA adapters are not supported", field=field)
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise InvalidArgument("per-module rank_pattern / alpha_pattern are not supported", field=field)
    try:
        alpha = float(config["lora_alpha"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument("lora_alpha must be a number", field=field) from exc

    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        stem = name.removeprefix(PEFT_PREFIX)
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if stem.endswith(suffix):
                pairs.setdefault(stem.removesuffix(suffix), {})[part] = tensor
                break
        else:
            raise InvalidArgument(f"unexpected tensor {name!r} in a LoRA adapter", field="data")

    modules: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
    for module, pair in pairs.items():
        if set(pair) != {"lora_A", "lora_B"}:
            raise InvalidArgument(f"module {module!r} lacks its lora_A or lora_B tensor", field="data")
        base = catalog.shapes.get(f"{module}.weight")
        if base is None or len(base) != 2:
            raise InvalidArgument(f"unknown target module {module!r}", field="data")
        a, b = pair["lora_A"], pair["lora_B"]
        out_features, in_features = base
        rank = a.shape[0]
        if a.ndim != 2 or b.ndim != 2 or a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise InvalidArgument(
                f"module {module!r}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit a "
                f"{out_features}×{in_features} weight",
                field="data",
            )
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        modules[module] = (a, b, scale)
    return LoraAdapter(modules=modules, tensors=tensors, config=config)


def read_directory(path: str, version: int, fmt: WeightFormat, catalog: ParamCatalog) -> ValidatedUpdate:
    """Read and validate weights from a directory (LoadWeights).

    A directory with ``adapter_config.json`` is a PEFT adapter; otherwise every ``*.safetensors``
    file in it makes up one (partial) state dict.
    """
    directory = Path(path)
    if not path or not directory.is_dir():
        raise InvalidArgument(f"{path!r} is not a directory", field="path")
    if fmt == WeightFormat.UNSPECIFIED:
        fmt = WeightFormat.LORA_ADAPTER if (directory / ADAPTER_CONFIG).exists() else WeightFormat.STATE_DICT
    try:
        if fmt == WeightFormat.LORA_ADAPTER:
            config_path, weights_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
            if not config_path.exists() or not weights_path.exists():
                raise InvalidArgument(
                    f"a LoRA directory needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}", field="path"
                )
            tensors = load_file(weights_path)
            return validate_tensors(
                version, fmt, tensors, config_path.read_text(), catalog, weights_path.stat().st_size
            )
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise InvalidArgument("no *.safetensors files in the directory", field="path")
        tensors = {}
        for file in files:
            tensors.update(load_file(file))
    except (SafetensorError, OSError) as exc:
        raise InvalidArgument(f"cannot read weights ({exc})", field="path") from exc
    return validate_tensors(version, fmt, tensors, "", catalog, sum(f.stat().st_size for f in files))


def state_dict_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """Serialize tensors to one safetensors file (as bytes; :func:`codec.encode` streams the
    same file without building it). Tensors sharing storage (tied embeddings) are allowed."""
    return codec.encode(state_dict).to_bytes()


def adapter_dir_payload(adapter_dir: str | Path) -> tuple[bytes, str]:
    """(safetensors bytes, adapter_config.json text) of a PEFT adapter saved with save_pretrained."""
    directory = Path(adapter_dir)
    return (directory / ADAPTER_WEIGHTS).read_bytes(), (directory / ADAPTER_CONFIG).read_text()
