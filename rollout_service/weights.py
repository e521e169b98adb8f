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
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.model_classes import auto_model_class
from rollout_service.confined_files import confined_directory, read_confined
from rollout_service.types import WeightFormat, WeightPayload
from rollout_service.weight_plane import payload as codec
from rollout_service.weight_plane.payload import ADAPTER_CONFIG, ADAPTER_WEIGHTS

PEFT_PREFIX = "base_model.model."
# The dtypes models are served in. Others are refused: float8 and integers are no weights to
# copy into a float model, and float64 values beyond float32's range would turn into inf.
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Largest float32 value: a LoRA delta bound above it would overflow the merged weight.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
MAX_ADAPTER_CONFIG_BYTES = 1 << 20
MAX_WEIGHT_FILES = 1024
# Elements per slice of the finiteness check (4 MiB of float32: fits in cache with its temporaries).
FINITE_SLICE = 1 << 20


@dataclass(frozen=True)
class ParamCatalog:
    """Names → shapes of the base model's parameters and buffers in ``state_dict()`` naming.

    Built from a meta-device instance of the model's config, so it costs no memory and works
    for engines (vLLM) that do not hold an HF module in this process.

    ``aliases``: a second name of a tied parameter → its first name in ``named_parameters()``
    order (a tied model: ``lm_head.weight`` → ``model.embed_tokens.weight``).
    """

    shapes: dict[str, tuple[int, ...]]
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ParamCatalog:
        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = auto_model_class(config).from_config(config)
        first: dict[int, str] = {}
        aliases = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            if (canonical := first.setdefault(id(param), name)) != name:
                aliases[name] = canonical
        return cls({name: tuple(t.shape) for name, t in model.state_dict().items()}, aliases)

    @property
    def max_payload_bytes(self) -> int:
        """Default cap on a weight payload: every parameter twice in float32 (the widest accepted
        dtype), plus 1 MiB for the header. A full state dict fits, and so does a LoRA adapter of
        any rank up to full on every matrix (r·(in + out) ≤ 2·in·out elements)."""
        return 2 * 4 * sum(math.prod(shape) for shape in self.shapes.values()) + (1 << 20)


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

    def merge_into(self, module: str, base: torch.Tensor, out: torch.Tensor) -> None:
        """``out = base + s · B @ A`` for one module, shapes (out, in); ``out`` must not alias ``base``.

        One fused GEMM (``addmm``) writing straight into ``out`` when it is float32: no temporaries, several
        times faster than forming ``s · B @ A`` and adding it, and it runs after every optimizer step.
        Otherwise computed in float32 and rounded once into ``out``'s dtype."""
        a, b, scale = self.modules[module]
        a, b = a.to(out.device, torch.float32), b.to(out.device, torch.float32)
        if out.dtype == torch.float32 and base.dtype == torch.float32:
            torch.addmm(base, b, a, alpha=scale, out=out)
        else:
            out.copy_(torch.addmm(base.float(), b, a, alpha=scale))

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
    """No NaN or infinity in a float tensor.

    On CPU this is done with numpy (single-threaded), in slices of :data:`FINITE_SLICE` elements so
    the temporaries stay in cache: torch's parallel reduction spins its OpenMP threads, which on a
    busy machine costs tens of times the pass itself, and a whole-tensor ``isfinite`` mask costs a
    page fault per 4 KiB. float32 / float16: ``x · 0`` is 0 exactly when every element is finite
    (inf · 0 and NaN · 0 are NaN), one BLAS dot product per slice (~5 GB/s here). bfloat16, which
    numpy lacks, is checked on its bits: exponent all ones (0x7F80) means inf or NaN.
    """
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        return bool(torch.isfinite(flat).all())
    if flat.dtype == torch.bfloat16:
        bits = flat.view(torch.int16).numpy()
        exponent = np.int16(0x7F80)
        scratch = np.empty(min(len(bits), FINITE_SLICE), dtype=np.int16)
        for start in range(0, len(bits), FINITE_SLICE):
            part = bits[start : start + FINITE_SLICE]
            masked = np.bitwise_and(part, exponent, out=scratch[: len(part)])
            if (masked == exponent).any():
                return False
        return True
    values = flat.numpy()
    zeros = np.zeros(min(len(values), FINITE_SLICE), dtype=np.float32)
    with np.errstate(invalid="ignore"):  # inf · 0 is the NaN looked for, not a mistake
        for start in range(0, len(values), FINITE_SLICE):
            part = values[start : start + FINITE_SLICE].astype(np.float32, copy=False)
            if not np.isfinite(np.dot(part, zeros[: len(part)])):
                return False
    return True


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
    """Validate parsed tensors of either format against the model's parameters.

    Every tensor must have an accepted dtype, at least one dimension and one element, and
    finite values (one numpy pass over the payload: ~7 ms per 85 MB of float32 here).
    """
    for name, tensor in tensors.items():
        if tensor.dtype not in WEIGHT_DTYPES:
            raise InvalidArgument(
                f"tensor {name!r} has dtype {codec.DTYPE_NAMES.get(tensor.dtype, tensor.dtype)}; "
                "weights must be F32, BF16 or F16",
                field="data",
            )
        if tensor.ndim == 0 or tensor.numel() == 0:
            raise InvalidArgument(
                f"tensor {name!r} has shape {list(tensor.shape)}; weights have a dimension and elements",
                field="data",
            )
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
        return ValidatedUpdate(version, fmt, state_dict=_fold_aliases(tensors, catalog), nbytes=nbytes)
    raise InvalidArgument("must be LORA_ADAPTER or STATE_DICT", field="format")


def _fold_aliases(tensors: dict[str, torch.Tensor], catalog: ParamCatalog) -> dict[str, torch.Tensor]:
    """The state dict with each tied parameter under its first name only.

    A tied model's ``state_dict()`` holds the shared tensor under both names (``lm_head.weight``
    alone is the same parameter too). The engines load it once, under the first name; differing
    values under the two names are refused rather than one of them winning unseen (which one
    would differ between engines).
    """
    folded = dict(tensors)
    for alias, canonical in catalog.aliases.items():
        if alias not in folded:
            continue
        tensor = folded.pop(alias)
        if canonical not in folded:
            folded[canonical] = tensor
        elif not torch.equal(folded[canonical], tensor):
            raise InvalidArgument(
                f"tensor {alias!r} is tied to {canonical!r} in this model, but their values differ",
                field="data",
            )
    return folded


def _validate_lora(
    tensors: dict[str, torch.Tensor], adapter_config_json: str, catalog: ParamCatalog
) -> LoraAdapter:
    field = "adapter_config_json"
    config = _adapter_config(adapter_config_json, field)
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidArgument(f"peft_type {config.get('peft_type')!r} is not LORA", field=field)
    if config.get("use_dora"):
        raise InvalidArgument("DoRA adapters are not supported", field=field)
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise InvalidArgument("per-module rank_pattern / alpha_pattern are not supported", field=field)
    alpha = config.get("lora_alpha")
    # bool is an int subclass, and JSON's true is no alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InvalidArgument(f"lora_alpha must be a finite number, got {alpha!r}", field=field)
    declared_rank = config.get("r")
    if declared_rank is not None and (type(declared_rank) is not int or declared_rank < 1):
        raise InvalidArgument(f"r must be an integer >= 1, got {declared_rank!r}", field=field)
    rslora = config.get("use_rslora", False)
    if type(rslora) is not bool:
        raise InvalidArgument(f"use_rslora must be true or false, got {rslora!r}", field=field)

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
        rank = a.shape[0] if a.ndim == 2 else 0
        if rank < 1 or b.ndim != 2 or a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise InvalidArgument(
                f"module {module!r}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit a "
                f"{out_features}×{in_features} weight with a rank >= 1",
                field="data",
            )
        if declared_rank is not None and rank != declared_rank:
            raise InvalidArgument(
                f"module {module!r} has rank {rank}, the config's r is {declared_rank}", field="data"
            )
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank
        # |s·(B @ A)_ij| ≤ |s| · r · max|B| · max|A|: past float32's range the merge overflows.
        bound = abs(scale) * rank * float(b.abs().max()) * float(a.abs().max())
        if not bound <= FLOAT32_MAX:
            raise InvalidArgument(
                f"module {module!r}: the update s·B·A can exceed float32's range (bound {bound:.3g})",
                field="data",
            )
        modules[module] = (a, b, scale)
    return LoraAdapter(modules=modules, tensors=tensors, config=config)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def _adapter_config(text: str, field: str) -> dict:
    """adapter_config.json as a dict; refuses non-finite numbers and oversized or deep JSON."""
    if not text:
        raise InvalidArgument("required for a LoRA adapter", field=field)
    if len(text) > MAX_ADAPTER_CONFIG_BYTES:
        raise InvalidArgument(f"longer than {MAX_ADAPTER_CONFIG_BYTES} characters", field=field)
    try:
        config = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"not valid JSON ({exc.msg})", field=field) from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"not a valid adapter config ({exc})", field=field) from exc
    if not isinstance(config, dict):
        raise InvalidArgument("must be a JSON object", field=field)
    return config


def read_directory(
    path: str,
    version: int,
    fmt: WeightFormat,
    catalog: ParamCatalog,
    root: Path,
    max_bytes: int | None = None,
) -> ValidatedUpdate:
    """Read and validate weights from a directory under ``root`` (LoadWeights; blocking I/O).

    A directory with ``adapter_config.json`` is a PEFT adapter; otherwise every ``*.safetensors``
    file in it makes up one (partial) state dict. Files are read only as regular files under
    ``root`` (``confined_files``), ``max_bytes`` in all (default
    ``catalog.max_payload_bytes``).
    """
    field = "path"
    budget = max_bytes or catalog.max_payload_bytes
    directory = confined_directory(root, path, field)
    names = {entry.name for entry in _listing(directory, field)}
    if fmt == WeightFormat.UNSPECIFIED:
        fmt = WeightFormat.LORA_ADAPTER if ADAPTER_CONFIG in names else WeightFormat.STATE_DICT
    if fmt == WeightFormat.LORA_ADAPTER:
        if ADAPTER_CONFIG not in names or ADAPTER_WEIGHTS not in names:
            raise InvalidArgument(
                f"a LoRA directory needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}", field=field
            )
        config = read_confined(root, directory / ADAPTER_CONFIG, MAX_ADAPTER_CONFIG_BYTES, field)
        data = read_confined(root, directory / ADAPTER_WEIGHTS, budget, field)
        try:
            config_text = bytes(config).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"{ADAPTER_CONFIG} is not UTF-8", field=field) from exc
        tensors = parse_safetensors(data, field=field)
        return validate_tensors(version, fmt, tensors, config_text, catalog, len(data))
    files = sorted(name for name in names if name.endswith(".safetensors"))
    if not files:
        raise InvalidArgument("no *.safetensors files in the directory", field=field)
    tensors = {}
    total = 0
    for name in files:
        data = read_confined(root, directory / name, max(budget - total, 0), field)
        total += len(data)
        tensors.update(parse_safetensors(data, field=field))
    return validate_tensors(version, fmt, tensors, "", catalog, total)


def _listing(directory: Path, field: str) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as entries:
            listing = list(itertools.islice(entries, MAX_WEIGHT_FILES + 1))
    except OSError as exc:
        raise InvalidArgument(f"cannot list the directory ({exc.strerror})", field=field) from exc
    if len(listing) > MAX_WEIGHT_FILES:
        raise InvalidArgument(f"more than {MAX_WEIGHT_FILES} entries in the directory", field=field)
    return listing


def state_dict_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """Serialize tensors to one safetensors file (as bytes; :func:`codec.encode` streams the
    same file without building it). Tensors sharing storage (tied embeddings) are allowed."""
    return codec.encode(state_dict).to_bytes()
