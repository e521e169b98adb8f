"""Weight payloads as bytes: zero-copy safetensors encoding and parsing, incremental receiving.

The ``UpdateWeights`` stream carries one safetensors file cut into chunks. Its layout
(https://huggingface.co/docs/safetensors):

    [8 bytes: header length n, u64 little-endian][n bytes: JSON header][tensor data]

The JSON maps every tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the start of the data section) plus an optional ``"__metadata__"``
string map. The data section is the raw little-endian bytes of every tensor, back to back
(read as they are: every platform torch and vLLM run on here is little-endian).

Why not ``safetensors.torch.save`` / ``load``: each copies the whole payload once more
(save builds one ``bytes``; load copies every tensor out of it), and on this project's 2-core
machine one copy of an 85 MB update into fresh memory takes 15–50 ms (bandwidth plus
first-touch page faults). Here:

- :func:`encode` writes only the header; the data are memoryviews of the caller's tensors,
  hashed and cut into chunks without a copy;
- :class:`PayloadReceiver` writes arriving chunks into one preallocated buffer and updates
  the SHA-256 as they come, so the checksum is ready when the last chunk lands;
- :func:`parse` returns tensors that are views into that buffer, after checking the header
  as strictly as the safetensors library does (bounds, contiguous offsets, sizes).

A PEFT adapter saved with ``save_pretrained`` already is such a file (:func:`adapter_dir_payload`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import final

import numpy as np
import torch

from grpo_runtime.errors import InvalidArgument, ResourceExhausted

# safetensors dtype names ↔ torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The safetensors library's own bound on the JSON header.
MAX_HEADER_BYTES = 100_000_000
HEADER_ALIGN = 8
METADATA_KEY = "__metadata__"
# The files of a PEFT adapter saved with ``save_pretrained``.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

Buffer = bytes | bytearray | memoryview


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (bfloat16 and bool included)."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data


@final  # lets mypy narrow the client's isinstance on the lazily imported class
@dataclass(frozen=True)
class EncodedPayload:
    """A safetensors file as a header plus views of the tensors' memory (no data copied).

    ``parts`` are the header bytes then every tensor's bytes in file order; ``nbytes`` is
    their total size. The tensors must not change while the payload is hashed or sent.
    """

    parts: tuple[memoryview, ...]
    nbytes: int
    num_tensors: int

    @functools.cached_property
    def sha256(self) -> str:
        """Lowercase hex SHA-256 of the whole file, computed once (pushing one payload to several
        replicas hashes it once; hashlib releases the GIL on each part)."""
        digest = hashlib.sha256()
        for part in self.parts:
            digest.update(part)
        return digest.hexdigest()

    def chunks(self, chunk_bytes: int) -> Iterator[memoryview | bytes]:
        """The file cut into pieces of exactly ``chunk_bytes`` (the last one shorter).

        A piece inside one part is a view of it; a piece spanning parts is joined (one copy
        of at most ``chunk_bytes``)."""
        pending: list[memoryview] = []
        pending_bytes = 0
        for part in self.parts:
            start = 0
            while start < len(part):
                take = min(chunk_bytes - pending_bytes, len(part) - start)
                piece = part[start : start + take]
                start += take
                if not pending and take == chunk_bytes:
                    yield piece
                    continue
                pending.append(piece)
                pending_bytes += take
                if pending_bytes == chunk_bytes:
                    yield b"".join(pending)
                    pending, pending_bytes = [], 0
        if pending:
            yield b"".join(pending)

    def to_bytes(self) -> bytes:
        return b"".join(self.parts)


def encode(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> EncodedPayload:
    """A safetensors file of ``tensors`` (moved to CPU and made contiguous only where needed).

    Tensors are laid out by decreasing element size, then name, as the safetensors library
    does, so every tensor's offset is aligned to its element size once the header is padded
    to a multiple of 8. Tensors sharing storage (tied embeddings) are simply written twice.
    """
    prepared: list[tuple[str, torch.Tensor]] = []
    for name, tensor in tensors.items():
        if tensor.dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors name")
        prepared.append((name, tensor.detach().to("cpu").contiguous()))
    prepared.sort(key=lambda item: (-item[1].element_size(), item[0]))
    header: dict[str, object] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    views: list[memoryview] = []
    offset = 0
    for name, tensor in prepared:
        view = _byte_view(tensor)
        header[name] = {
            "dtype": DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(view)],
        }
        offset += len(view)
        views.append(view)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % HEADER_ALIGN)
    head = memoryview(struct.pack("<Q", len(text)) + text)
    return EncodedPayload((head, *views), len(head) + offset, len(prepared))


def parse(data: Buffer, field: str = "data") -> dict[str, torch.Tensor]:
    """Tensors of one safetensors file, as views into ``data`` (no copy when ``data`` is writable).

    Checks what the safetensors library checks: the header length fits, the header is a
    JSON object of well-formed entries with known dtypes, and the data offsets tile the data
    section exactly (sorted, no gap, no overlap, each range = numel × element size). Any
    violation is InvalidArgument(``field``). ``bytes`` input (read-only) is copied once.
    """
    if not len(data):
        raise InvalidArgument("empty weight payload", field=field)
    view = memoryview(data).cast("B")
    if view.readonly:
        view = memoryview(bytearray(view))
    if len(view) < 8:
        raise InvalidArgument("not a valid safetensors payload (shorter than its header length)", field=field)
    (header_len,) = struct.unpack_from("<Q", view)
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(view):
        raise InvalidArgument(
            f"not a valid safetensors payload (header length {header_len} past {len(view)} bytes)",
            field=field,
        )
    try:
        header = json.loads(bytes(view[8 : 8 + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"not a valid safetensors payload (header: {exc})", field=field) from exc
    if not isinstance(header, dict):
        raise InvalidArgument("not a valid safetensors payload (header is not an object)", field=field)
    header.pop(METADATA_KEY, None)
    if not header:
        raise InvalidArgument("the safetensors payload holds no tensors", field=field)
    entries = sorted(
        ((_entry(name, spec, field), name) for name, spec in header.items()), key=lambda e: e[0][2]
    )
    body = torch.frombuffer(view, dtype=torch.uint8)[8 + header_len :]
    position = 0
    tensors: dict[str, torch.Tensor] = {}
    for (dtype, shape, (begin, end)), name in entries:
        numel = 1
        for size in shape:
            numel *= size
        if end > len(body):
            raise InvalidArgument(
                f"not a valid safetensors payload (tensor {name!r} ends at {end}, past the "
                f"{len(body)} data bytes)",
                field=field,
            )
        if begin != position or end - begin != numel * dtype.itemsize:
            raise InvalidArgument(
                f"not a valid safetensors payload (tensor {name!r}: offsets {[begin, end]} do not "
                f"follow {position} with {numel} × {dtype.itemsize} bytes)",
                field=field,
            )
        position = end
        tensors[name] = _tensor_at(body, begin, end, dtype, shape)
    if position != len(body):
        raise InvalidArgument(
            f"not a valid safetensors payload (tensors cover {position} of {len(body)} data bytes)",
            field=field,
        )
    return tensors


def _entry(name: str, spec: object, field: str) -> tuple[torch.dtype, tuple[int, ...], tuple[int, int]]:
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(f"not a valid safetensors payload (tensor {name!r}: {why})", field=field)

    if not isinstance(spec, dict):
        raise bad("entry is not an object")
    dtype = DTYPES.get(spec.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise bad(f"unknown dtype {spec.get('dtype')!r}")
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise bad(f"bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise bad(f"bad data_offsets {offsets!r}")
    return dtype, tuple(shape), (offsets[0], offsets[1])


def _tensor_at(
    body: torch.Tensor, begin: int, end: int, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """``body[begin:end]`` viewed as ``dtype`` / ``shape``; copied only when misaligned for it."""
    raw = body[begin:end]
    if raw.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    if raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()  # torch views a byte range as a wider dtype only at aligned offsets
    return raw.view(dtype).view(shape)


class PayloadReceiver:
    """Assembles a streamed payload into one buffer while hashing it.

    ``expected_bytes`` (the header's ``total_bytes``; 0 = undeclared) sizes the buffer up
    front, and a stream that overruns it is refused at the chunk that does. Undeclared, the
    chunks are kept in a list and joined once at the end. ``max_bytes`` (None = no limit) is
    the server's cap on a payload: a larger declaration, or a stream growing past it, is
    RESOURCE_EXHAUSTED. ``add`` is called from one thread at a time, in stream order.
    """

    def __init__(self, expected_bytes: int = 0, max_bytes: int | None = None) -> None:
        if max_bytes is not None and expected_bytes > max_bytes:
            raise ResourceExhausted(
                f"declared {expected_bytes} bytes, more than the server's limit "
                f"max_weight_bytes = {max_bytes}",
                field="total_bytes",
            )
        self.expected_bytes = expected_bytes
        self.max_bytes = max_bytes
        self.received = 0
        self._digest = hashlib.sha256()
        self._buffer: np.ndarray | None = None
        self._parts: list[bytes] = []
        if expected_bytes:
            try:
                # np.empty leaves the pages untouched until written (no zero-fill pass).
                self._buffer = np.empty(expected_bytes, dtype=np.uint8)
            except (MemoryError, ValueError) as exc:
                raise InvalidArgument(
                    f"cannot hold {expected_bytes} bytes ({exc})", field="total_bytes"
                ) from exc

    def add(self, data: Buffer) -> None:
        """Append one chunk's bytes: copy into the buffer and update the SHA-256."""
        size = len(data)
        if self._buffer is not None:
            end = self.received + size
            if end > self.expected_bytes:
                raise InvalidArgument(
                    f"declared {self.expected_bytes} bytes, received at least {end}", field="total_bytes"
                )
            # numpy copies with the GIL released (a memoryview slice assignment holds it), so the
            # event loop keeps reading the stream meanwhile; hashlib releases it too.
            self._buffer[self.received : end] = np.frombuffer(data, dtype=np.uint8)
            self._digest.update(data)
        else:
            if self.max_bytes is not None and self.received + size > self.max_bytes:
                raise ResourceExhausted(
                    f"the stream passed the server's limit max_weight_bytes = {self.max_bytes}",
                    field="data",
                )
            self._parts.append(bytes(data))
            self._digest.update(data)
        self.received += size

    def finish(self) -> tuple[memoryview | bytes, str]:
        """(the payload, its lowercase hex SHA-256)."""
        if self._buffer is not None:
            if self.received != self.expected_bytes:
                raise InvalidArgument(
                    f"declared {self.expected_bytes} bytes, received {self.received}", field="total_bytes"
                )
            data: memoryview | bytes = self._buffer.data
        else:
            data = b"".join(self._parts)
        return data, self._digest.hexdigest()


def adapter_dir_payload(adapter_dir: str | Path) -> tuple[bytes, str]:
    """(safetensors bytes, adapter_config.json text) of a PEFT adapter saved with save_pretrained."""
    directory = Path(adapter_dir)
    return (directory / ADAPTER_WEIGHTS).read_bytes(), (directory / ADAPTER_CONFIG).read_text()
