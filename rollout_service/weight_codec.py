"""The torch side of the rollout service's codec (:mod:`rollout_service.codec`): the ``UpdateWeights``
chunk stream, ``OpenWeightChannel``'s group and ``UpdateWeightsFromChannel``'s manifest and reply, both
directions of each, for the servicer and the client. Their domain types (payload buffers, bucket layouts,
torch.distributed groups: :mod:`rollout_service.weight_plane`) import torch, so the client imports this
module at its first weight push only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

from grpo.rollout.v1 import rollout_pb2

from grpo_runtime.errors import InvalidArgument
from rollout_service.codec import decode_reported_transport, decode_weight_format, decode_weight_transport
from rollout_service.types import WeightFormat, WeightPayload, WeightTransport
from rollout_service.weight_plane.distributed import GroupSpec
from rollout_service.weight_plane.manifest import ChannelApplied, ChannelManifest, TensorLayout
from rollout_service.weight_plane.payload import EncodedPayload, PayloadReceiver

# OpenWeightChannel's default wait for the group to form, in seconds.
DEFAULT_JOIN_TIMEOUT_S = 60.0
# WeightChunk.data is field 6, wire type 2 (length-delimited): tag byte (6 << 3) | 2.
DATA_TAG = b"\x32"


# ------------------------------------------------------ WeightChunk stream
def encode_weight_header(
    payload: EncodedPayload, version: int, fmt: WeightFormat, adapter_config_json: str
) -> bytes:
    """The first chunk's header fields, serialized once for every (re)try of the stream. The header goes
    first, so the whole payload is hashed before the first byte is sent."""
    header = rollout_pb2.WeightChunk(
        version=version,
        format=int(fmt),  # type: ignore[arg-type]  # protoc .pyi: no int
        adapter_config_json=adapter_config_json,
        total_bytes=payload.nbytes,
        sha256=payload.sha256,
    )
    return header.SerializeToString()


def encode_weight_chunks(payload: EncodedPayload, header: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """Serialized WeightChunk messages of at most ``chunk_bytes`` data each: ``header``
    (:func:`encode_weight_header`) on the first, ``data`` on each.

    Protobuf's wire format is a sequence of fields, so a message is its serialized header
    fields followed by the ``data`` field written by hand: tag, varint length, the bytes
    (one copy of each chunk, into the message gRPC sends)."""
    prefix = header
    for piece in payload.chunks(chunk_bytes):
        yield b"".join((prefix, DATA_TAG, _varint(len(piece)), piece))
        prefix = b""
    if prefix:  # an empty payload: the header alone, for the server to refuse
        yield prefix


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint: 7 bits per byte, least significant first, high bit = more."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


async def decode_weight_chunks(
    chunks: AsyncIterator[rollout_pb2.WeightChunk], max_bytes: int
) -> WeightPayload:
    """Header from the first chunk; the payload is the concatenation of every chunk's data,
    at most ``max_bytes`` (RESOURCE_EXHAUSTED past it, at the chunk that overruns).

    Each chunk is copied into the receive buffer and hashed in a worker thread while the
    event loop takes the next one off the stream, so the SHA-256 is ready at the last chunk.
    """
    loop = asyncio.get_running_loop()
    header: rollout_pb2.WeightChunk | None = None
    receiver: PayloadReceiver | None = None
    pending: asyncio.Future[None] | None = None
    async for chunk in chunks:
        if receiver is None:
            header = chunk
            fmt = decode_weight_format(chunk.format)
            receiver = PayloadReceiver(chunk.total_bytes, max_bytes)
        if pending is not None:
            await pending
        pending = loop.run_in_executor(None, receiver.add, chunk.data)
    if header is None or receiver is None:
        raise InvalidArgument("the stream carried no chunk", field="chunks")
    if pending is not None:
        await pending
    data, digest = receiver.finish()
    return WeightPayload(
        version=header.version,
        format=fmt,
        data=data,
        sha256=header.sha256,
        total_bytes=header.total_bytes,
        adapter_config_json=header.adapter_config_json,
        received_sha256=digest,
    )


# -------------------------------------------------- OpenWeightChannelRequest
def encode_open_weight_channel(
    transport: WeightTransport, group: GroupSpec
) -> rollout_pb2.OpenWeightChannelRequest:
    """``group`` is read by the server for TORCH_DISTRIBUTED only."""
    return rollout_pb2.OpenWeightChannelRequest(
        transport=int(transport),  # type: ignore[arg-type]  # protoc .pyi: no int
        init_method=group.init_method,
        rank=group.rank,
        world_size=group.world_size,
        backend=group.backend,
        timeout_seconds=group.timeout_s,
    )


def decode_open_weight_channel(
    msg: rollout_pb2.OpenWeightChannelRequest,
) -> tuple[WeightTransport, GroupSpec | None]:
    """(transport, the group to join for TORCH_DISTRIBUTED, else None)."""
    transport = decode_weight_transport(msg.transport)
    if transport != WeightTransport.TORCH_DISTRIBUTED:
        return transport, None
    spec = GroupSpec(
        init_method=msg.init_method,
        rank=msg.rank,
        world_size=msg.world_size,
        backend=msg.backend or "gloo",
        timeout_s=msg.timeout_seconds or DEFAULT_JOIN_TIMEOUT_S,
    )
    return transport, spec


# ------------------------------------------- UpdateWeightsFromChannelRequest
def encode_channel_manifest(manifest: ChannelManifest) -> rollout_pb2.UpdateWeightsFromChannelRequest:
    return rollout_pb2.UpdateWeightsFromChannelRequest(
        version=manifest.version,
        format=int(manifest.format),  # type: ignore[arg-type]  # protoc .pyi: no int
        adapter_config_json=manifest.adapter_config_json,
        tensors=[
            rollout_pb2.TensorLayout(
                name=t.name, dtype=t.dtype, shape=t.shape, bucket=t.bucket, offset=t.offset, nbytes=t.nbytes
            )
            for t in manifest.tensors
        ],
        bucket_bytes=manifest.bucket_bytes,
        bucket_files=list(manifest.bucket_files),
    )


def decode_channel_manifest(msg: rollout_pb2.UpdateWeightsFromChannelRequest) -> ChannelManifest:
    return ChannelManifest(
        version=msg.version,
        format=decode_weight_format(msg.format),
        tensors=tuple(
            TensorLayout(t.name, t.dtype, tuple(t.shape), t.bucket, t.offset, t.nbytes) for t in msg.tensors
        ),
        bucket_bytes=tuple(msg.bucket_bytes),
        adapter_config_json=msg.adapter_config_json,
        bucket_files=tuple(msg.bucket_files),
    )


# ------------------------------------------ UpdateWeightsFromChannelResponse
def encode_channel_applied(applied: ChannelApplied) -> rollout_pb2.UpdateWeightsFromChannelResponse:
    return rollout_pb2.UpdateWeightsFromChannelResponse(
        policy_version=applied.policy_version,
        bytes_received=applied.bytes_received,
        tensors_loaded=applied.tensors_loaded,
        transfer_seconds=applied.transfer_seconds,
        apply_seconds=applied.apply_seconds,
        transport=int(applied.transport),  # type: ignore[arg-type]  # protoc .pyi: no int
    )


def decode_channel_applied(msg: rollout_pb2.UpdateWeightsFromChannelResponse) -> ChannelApplied:
    return ChannelApplied(
        msg.policy_version,
        msg.tensors_loaded,
        msg.bytes_received,
        msg.transfer_seconds,
        msg.apply_seconds,
        decode_reported_transport(msg.transport),
    )
