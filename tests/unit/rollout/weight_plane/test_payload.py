"""The weight payload codec: zero-copy safetensors encoding/parsing and the streaming receiver,
checked against the safetensors library itself."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError
from safetensors.torch import load as library_load
from safetensors.torch import save as library_save

from grpo_runtime.errors import InvalidArgument
from rollout_service.weight_plane.payload import PayloadReceiver, encode, parse


def mixed_tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    embed = torch.randn(6, 4)
    return {
        "embed.weight": embed,
        "lm_head.weight": embed,  # tied: shares storage with the embeddings
        "proj.weight": torch.randn(3, 5).bfloat16(),
        "half": torch.randn(7).half(),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
        "ids": torch.arange(5, dtype=torch.int16),
        "transposed": torch.randn(4, 3).t(),  # not contiguous
    }


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype, name
        # Bit for bit: a corrupted header can make bytes read as NaN, which never equals itself.
        assert got[name].shape == tensor.shape, name
        assert got[name].reshape(-1).view(torch.uint8).equal(tensor.reshape(-1).view(torch.uint8)), name


def test_encoded_file_is_what_the_library_reads_and_vice_versa():
    tensors = mixed_tensors()
    encoded = encode(tensors, metadata={"format": "pt"})
    data = encoded.to_bytes()
    assert len(data) == encoded.nbytes and encoded.num_tensors == len(tensors)
    assert_same(library_load(data), tensors)
    assert_same(parse(data), tensors)
    untied = {k: v.clone().contiguous() for k, v in tensors.items()}
    assert_same(parse(library_save(untied, metadata={"a": "b"})), tensors)


def test_encode_does_not_copy_and_parse_views_a_writable_buffer():
    weight = torch.randn(64, 32)
    encoded = encode({"w": weight})
    assert encoded.parts[1].obj is not None
    assert encoded.parts[1].tobytes() == weight.numpy().tobytes()
    buffer = bytearray(encoded.to_bytes())
    parsed = parse(memoryview(buffer))["w"]
    start = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    assert start <= parsed.data_ptr() < start + len(buffer)  # a view into the buffer
    assert torch.equal(parsed, weight)


def test_sha256_and_chunks_cover_the_file_exactly():
    encoded = encode(mixed_tensors())
    data = encoded.to_bytes()
    assert encoded.sha256 == hashlib.sha256(data).hexdigest()
    assert encoded.sha256 is encoded.sha256  # computed once per payload, however many pushes
    for size in (1, 7, 64, 100, len(data) - 1, len(data), 10 * len(data)):
        pieces = [bytes(p) for p in encoded.chunks(size)]
        assert b"".join(pieces) == data
        assert all(len(p) == size for p in pieces[:-1]) and 0 < len(pieces[-1]) <= size


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=5),
    dtypes=st.lists(st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.float64]), min_size=5),
    chunk=st.integers(1, 300),
)
def test_receiver_reassembles_any_chunking(shapes, dtypes, chunk):
    tensors = {f"t{i}": torch.ones(shape, dtype=dtypes[i]) * i for i, shape in enumerate(shapes)}
    encoded = encode(tensors)
    for declared in (encoded.nbytes, 0):
        receiver = PayloadReceiver(declared)
        for piece in encoded.chunks(chunk):
            receiver.add(piece)
        data, digest = receiver.finish()
        assert bytes(data) == encoded.to_bytes() and digest == encoded.sha256
        assert_same(parse(data), tensors)


def test_receiver_refuses_more_or_fewer_bytes_than_declared():
    receiver = PayloadReceiver(10)
    receiver.add(b"12345678")
    with pytest.raises(InvalidArgument) as info:
        receiver.add(b"abc")
    assert info.value.field == "total_bytes"
    short = PayloadReceiver(10)
    short.add(b"123")
    with pytest.raises(InvalidArgument) as info:
        short.finish()
    assert info.value.field == "total_bytes"


def raw_file(header: dict, body: bytes, header_len: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if header_len is None else header_len) + text + body


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01\x02",
        raw_file({"a": F32}, bytes(8), header_len=10**9),
        raw_file({"a": F32}, bytes(8), header_len=3),
        b"\x05\x00\x00\x00\x00\x00\x00\x00{abcd",
        raw_file([1, 2], b""),  # type: ignore[arg-type]
        raw_file({"a": F32}, bytes(7)),  # truncated data
        raw_file({"a": F32}, bytes(12)),  # trailing bytes
        raw_file({"a": {**F32, "dtype": "F33"}}, bytes(8)),
        raw_file({"a": {**F32, "shape": [3]}}, bytes(8)),
        raw_file({"a": {**F32, "shape": [-2]}}, bytes(8)),
        raw_file({"a": {**F32, "data_offsets": [8, 0]}}, bytes(8)),
        raw_file({"a": {**F32, "data_offsets": [0]}}, bytes(8)),
        raw_file({"a": "F32"}, bytes(8)),
        raw_file({"a": F32, "b": F32}, bytes(16)),  # overlapping
        raw_file({"a": F32, "b": {**F32, "data_offsets": [12, 20]}}, bytes(20)),  # a gap
    ],
)
def test_parse_refuses_what_is_not_a_safetensors_file(data):
    with pytest.raises(InvalidArgument) as info:
        parse(data, field="data")
    assert info.value.field == "data"
    if len(data) >= 8:
        with pytest.raises((SafetensorError, ValueError, RuntimeError)):
            library_load(data)


@pytest.mark.parametrize("header", [{}, {"__metadata__": {"a": "b"}}])
def test_a_file_without_tensors_is_not_an_update(header):
    assert library_load(raw_file(header, b"")) == {}  # valid for the library, useless here
    with pytest.raises(InvalidArgument, match="no tensors"):
        parse(raw_file(header, b""))


def test_misaligned_tensor_is_copied_to_an_aligned_one():
    # A 3-byte int8 tensor then a float32 one: the float32 data starts at an odd offset.
    body = bytes([1, 2, 3]) + struct.pack("<2f", 1.5, -2.0)
    header = {
        "b": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},
        "f": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = struct.pack("<Q", len(text)) + text + body
    parsed = parse(bytearray(data))
    assert parsed["f"].tolist() == [1.5, -2.0] and parsed["b"].tolist() == [1, 2, 3]
    assert_same(parsed, library_load(data))


@settings(max_examples=60, deadline=None)
@given(position=st.integers(0, 200), value=st.integers(0, 255))
def test_a_corrupt_header_byte_is_refused_or_read_as_the_library_reads_it(position, value):
    data = bytearray(encode({"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4).half()}).to_bytes())
    position %= len(data)
    data[position] = value
    try:
        ours = parse(bytes(data))
    except InvalidArgument:
        return  # stricter than the library is allowed; looser is not
    assert_same(ours, library_load(bytes(data)))
