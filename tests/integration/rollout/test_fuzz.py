"""Property-based fuzzing of every rollout RPC against a real server (HF engine, tiny model).

Whatever a caller sends, the answer is OK or a status that names the caller's mistake or a
server limit — never INTERNAL or UNKNOWN — an OK Generate carries finite logprobs and token ids
in the vocabulary, a refused weight update leaves the serving weights and version exactly as
they were (all-or-nothing), and the server stays SERVING and generating afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.common.v1 import common_pb2
from grpo.rollout.v1 import rollout_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from rollout_service.settings import RolloutSettings
from rollout_service.weight_plane.payload import DTYPES, encode
from tests.integration.rollout.fixtures import rollout_server_thread

VOCAB = 513
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
}
GREEDY = rollout_pb2.GenerateRequest(
    prompts=[rollout_pb2.Prompt(text="What is 12 + 7?")],
    n=1,
    sampling=rollout_pb2.SamplingParams(max_tokens=6, temperature=0.0),
)
FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def weights_root(tmp_path_factory, tiny_models):
    root = tmp_path_factory.mktemp("fuzz_root").resolve()
    state = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).state_dict()
    state.pop("lm_head.weight")
    (root / "base").mkdir()
    (root / "base" / "model.safetensors").write_bytes(encode(state).to_bytes())
    (root / "adapter").mkdir()
    (root / "adapter" / "adapter_config.json").write_text('{"lora_alpha": NaN}')
    (root / "adapter" / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    os.mkfifo(root / "fifo.safetensors")
    (root / "zero").symlink_to("/dev/zero")
    return root


@pytest.fixture(scope="module")
def server(tiny_models, weights_root):
    settings_ = RolloutSettings(
        model=str(tiny_models["policy"]),
        engine="hf",
        max_request_tokens=1024,  # keeps every accepted random request a few ms of work
        weights_root=str(weights_root),
    )
    with rollout_server_thread(settings_) as running:
        yield running


@pytest.fixture(scope="module")
def health(server):
    with grpc.insecure_channel(server.address) as channel:
        yield health_pb2_grpc.HealthStub(channel)


def call(method, request):
    """(status code, response or None) of one call with a deadline."""
    try:
        return grpc.StatusCode.OK, method(request, timeout=60)
    except grpc.RpcError as exc:
        assert exc.code() in ALLOWED, (exc.code(), exc.details())
        return exc.code(), None


def version(stub) -> int:
    return stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10).policy_version


def greedy_tokens(stub) -> list[int]:
    return list(stub.Generate(GREEDY, timeout=30).completions[0].token_ids)


def assert_healthy(stub, health) -> None:
    status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert len(greedy_tokens(stub)) > 0


# ------------------------------------------------------------------------------ strategies
# Each value is mostly valid and sometimes hostile, so examples get past the first check and
# reach the deeper ones (tokenization, the engine, the payload parser).
def mostly(valid, hostile):
    """``valid`` about 4 times in 5 (st.one_of and small integers lean towards one branch)."""
    return st.sampled_from([valid, valid, valid, valid, hostile]).flatmap(lambda strategy: strategy)


hostile_floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
text = st.text(max_size=40)
words = st.text(min_size=1, max_size=40)
token_ids = st.lists(mostly(st.integers(0, VOCAB - 1), st.integers(-(2**31), 2**31 - 1)), max_size=12)
messages = st.lists(st.builds(common_pb2.ChatMessage, role=mostly(words, text), content=text), max_size=3)
prompts = mostly(
    st.one_of(
        st.builds(rollout_pb2.Prompt, id=text, text=words),
        st.builds(rollout_pb2.Prompt, id=text, messages=messages),
        st.builds(rollout_pb2.Prompt, id=text, token_ids=token_ids),
    ),
    st.builds(rollout_pb2.Prompt, id=text, messages=messages, text=text, token_ids=token_ids),
)


@st.composite
def sampling_params(draw) -> rollout_pb2.SamplingParams:
    fields = {
        "temperature": mostly(st.sampled_from([0.0, 0.01, 0.7, 1.0, 100.0]), hostile_floats),
        "top_p": mostly(st.floats(0.0625, 1.0, width=32), hostile_floats),
        "top_k": mostly(st.integers(-1, 600), st.integers(-(2**31), 2**31 - 1)),
        "min_p": mostly(st.floats(0.0, 1.0, width=32), hostile_floats),
        "max_tokens": mostly(st.integers(1, 8), st.integers(0, 2**32 - 1)),
        "seed": st.integers(0, 2**64 - 1),
        "repetition_penalty": mostly(st.floats(0.5, 2.0, width=32), hostile_floats),
        "min_tokens": mostly(st.integers(0, 4), st.integers(0, 2**32 - 1)),
    }
    chosen = draw(st.sets(st.sampled_from(sorted(fields))))
    values = {name: draw(fields[name]) for name in sorted(chosen)}
    stop = draw(mostly(st.lists(st.text(min_size=1, max_size=8), max_size=2), st.lists(text, max_size=20)))
    return rollout_pb2.SamplingParams(stop=stop, **values)


generate_requests = st.builds(
    rollout_pb2.GenerateRequest,
    prompts=mostly(st.lists(prompts, min_size=1, max_size=3), st.lists(prompts, max_size=5)),
    n=mostly(st.integers(1, 4), st.integers(0, 2**32 - 1)),
    sampling=sampling_params(),
)


# ------------------------------------------------------------------------------- Generate
@FUZZ
@given(request=generate_requests)
def test_generate_answers_validly_or_refuses(stub, request):
    code, response = call(stub.Generate, request)
    if code != grpc.StatusCode.OK:
        return
    assert len(response.completions) == len(request.prompts) * request.n
    for completion in response.completions:
        assert len(completion.logprobs) == len(completion.token_ids)
        assert torch.isfinite(torch.tensor(list(completion.logprobs), dtype=torch.float32)).all()
        assert all(0 <= t < VOCAB for t in completion.token_ids)


@settings(FUZZ, max_examples=5)
@given(st.just(None))
def test_get_status_is_always_ok(stub, health, _):
    status = stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)
    assert status.engine == "hf" and status.max_model_len == 512
    assert_healthy(stub, health)


# -------------------------------------------------------------------------- UpdateWeights
@st.composite
def weight_payloads(draw) -> bytes:
    """A safetensors file: well-formed with random names, dtypes, shapes and values, or garbage."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.binary(max_size=256))
    names = ["model.norm.weight", "model.layers.0.input_layernorm.weight", "model.embed_tokens.weight"]
    names += [f"base_model.model.model.layers.0.self_attn.q_proj.lora_{ab}.weight" for ab in "AB"] + ["bogus"]
    shapes = mostly(
        st.sampled_from([(128,), (4, 128), (128, 4)]), st.sampled_from([(), (0,), (513, 128), (3,)])
    )
    dtypes = mostly(st.just(torch.float32), st.sampled_from(sorted(DTYPES.values(), key=str)))
    values = mostly(st.floats(-2, 2), st.sampled_from([float("nan"), float("inf"), 1e38]))
    tensors = {}
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        tensors[name] = torch.full(draw(shapes), draw(values)).to(draw(dtypes))
    data = encode(tensors).to_bytes()
    if draw(st.integers(0, 3)) == 0:  # flip one byte somewhere
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    return data


@st.composite
def weight_streams(draw, current: int) -> list[rollout_pb2.WeightChunk]:
    data = draw(weight_payloads())
    configs = ['{"lora_alpha": 8, "r": 4}', '{"lora_alpha": NaN, "r": 4}', '{"lora_alpha": 8, "r": 0}']
    digest = hashlib.sha256(data).hexdigest()
    header = rollout_pb2.WeightChunk(
        # The next version or a stale one: an accepted update never jumps the version out of
        # reach of the next example.
        version=draw(mostly(st.just(current + 1), st.sampled_from([current, 0]))),
        format=draw(mostly(st.sampled_from([1, 2]), st.integers(0, 2**31 - 1))),
        adapter_config_json=draw(mostly(st.sampled_from(configs), text)),
        total_bytes=draw(mostly(st.sampled_from([0, len(data)]), st.sampled_from([len(data) + 1, 2**63]))),
        sha256=draw(mostly(st.sampled_from([digest, digest.upper()]), st.sampled_from(["", "0" * 64]))),
    )
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    chunks = [rollout_pb2.WeightChunk(data=piece) for piece in pieces]
    chunks[0].MergeFrom(header)
    return draw(mostly(st.just(chunks), st.sampled_from([[], chunks[:1]])))


@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_update_weights_is_all_or_nothing(stub, health, weights_root, data):
    before_version, before_tokens = version(stub), greedy_tokens(stub)
    chunks = data.draw(weight_streams(before_version))
    code, response = call(stub.UpdateWeights, iter(chunks))
    if code == grpc.StatusCode.OK:
        assert response.policy_version == before_version + 1 == version(stub)
        # Finite weights may still overflow (1e38 norms): then Generate is FAILED_PRECONDITION,
        # never NaN with OK.
        code, generated = call(stub.Generate, GREEDY)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.FAILED_PRECONDITION)
        if code == grpc.StatusCode.OK:
            logprobs = generated.completions[0].logprobs
            assert torch.isfinite(torch.tensor(list(logprobs))).all()
        restore = rollout_pb2.LoadWeightsRequest(path="base", version=before_version + 2)
        assert call(stub.LoadWeights, restore)[0] == grpc.StatusCode.OK
    else:
        assert version(stub) == before_version
        assert greedy_tokens(stub) == before_tokens
    assert_healthy(stub, health)


# ---------------------------------------------------------------------------- LoadWeights
paths = st.one_of(
    text,
    st.sampled_from(
        ["", "base", "adapter", "fifo.safetensors", "zero", "/dev/zero", "/dev", "/etc", "..", "../..", "/"]
    ),
    st.builds(lambda a, b: f"{a}/{b}", st.sampled_from(["base", "..", "/proc/self", "zero"]), text),
)


@settings(FUZZ, max_examples=30)
@given(path=paths, bump=st.sampled_from([0, 1, 2**40]), fmt=st.integers(0, 4))
def test_load_weights_refuses_what_is_not_a_weight_directory(stub, health, path, bump, fmt):
    before_version, before_tokens = version(stub), greedy_tokens(stub)
    target = min(before_version + bump, before_version + 1) if path == "base" else before_version + bump
    code, response = call(
        stub.LoadWeights, rollout_pb2.LoadWeightsRequest(path=path, version=target, format=fmt)
    )
    if code == grpc.StatusCode.OK:
        assert response.policy_version == target == version(stub)
        assert greedy_tokens(stub) == before_tokens  # "base" holds the base weights
    else:
        assert version(stub) == before_version
        assert greedy_tokens(stub) == before_tokens
    assert_healthy(stub, health)


# --------------------------------------------------------------------------- Sleep, WakeUp
@settings(FUZZ, max_examples=10)
@given(level=st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 3)))
def test_sleep_then_wake_up_restores_generation(stub, health, level):
    before_tokens = greedy_tokens(stub)
    code, _ = call(stub.Sleep, rollout_pb2.SleepRequest(level=level))
    assert (code == grpc.StatusCode.OK) == (level in (1, 2))
    assert call(stub.WakeUp, rollout_pb2.WakeUpRequest())[0] == grpc.StatusCode.OK
    status = stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)
    if not status.weights_valid:  # level 2 discarded them: a load makes them valid again
        load = rollout_pb2.LoadWeightsRequest(path="base", version=status.policy_version + 1)
        assert call(stub.LoadWeights, load)[0] == grpc.StatusCode.OK
    assert greedy_tokens(stub) == before_tokens
    assert_healthy(stub, health)


@settings(FUZZ, max_examples=10)
@given(tags=st.lists(st.one_of(text, st.sampled_from(["weights", "kv_cache"])), max_size=3))
def test_wake_up_with_any_tags(stub, health, tags):
    code, response = call(stub.WakeUp, rollout_pb2.WakeUpRequest(tags=tags))
    assert (code == grpc.StatusCode.OK) == all(t in ("weights", "kv_cache") for t in tags)
    if code == grpc.StatusCode.OK:
        assert response.weights_valid
    assert_healthy(stub, health)


def test_json_configs_with_non_finite_numbers_are_refused_by_update_weights(stub):
    """A fixed example of the class the fuzzer draws from (so a regression names itself)."""
    data = encode(
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 128)}
    ).to_bytes()
    chunk = rollout_pb2.WeightChunk(
        version=version(stub) + 1,
        format=rollout_pb2.WEIGHT_FORMAT_LORA_ADAPTER,
        adapter_config_json=json.dumps({"lora_alpha": float("nan"), "r": 4}),
        sha256=hashlib.sha256(data).hexdigest(),
        data=data,
    )
    code, _ = call(stub.UpdateWeights, iter([chunk]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
