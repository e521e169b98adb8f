"""Hostile callers against a real rollout server (HF engine, tiny model) on 127.0.0.1: bounded
work for Generate, numerical validity of every answer, and LoadWeights confined to its root.

The tests share one server and build on its weight versions (each reads the serving version
first); every test leaves the base weights serving.
"""

from __future__ import annotations

import json
import os
import threading
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.rollout.v1 import rollout_pb2
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from rollout_service import codec as rollout_codec
from rollout_service.api.rollout import INLINE_PROMPTS
from rollout_service.core.rollout import INLINE_TOKENS
from rollout_service.settings import RolloutSettings
from rollout_service.weight_plane.payload import encode
from tests.integration.rollout.fixtures import rollout_server_thread
from tests.support.hostile_images import encoded, picture, png_bomb
from tests.support.statuses import failure

MAX_CONCURRENT = 2
MAX_WEIGHT_BYTES = 256 << 20
GREEDY = {"max_tokens": 8, "temperature": 0.0}
PROMPT = ["What is 12 + 7?"]


@pytest.fixture(scope="module")
def weights_root(tmp_path_factory):
    return tmp_path_factory.mktemp("weights_root").resolve()


@pytest.fixture(scope="module")
def server(tiny_models, weights_root):
    settings = RolloutSettings(
        model=str(tiny_models["policy"]),
        engine="hf",
        max_batch_size=4,  # a big request is many engine batches
        max_concurrent_generates=MAX_CONCURRENT,
        weights_root=str(weights_root),
        max_weight_bytes=MAX_WEIGHT_BYTES,
    )
    with rollout_server_thread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def base_state(tiny_models):
    state = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).state_dict()
    state.pop("lm_head.weight")  # tied to the embeddings
    return state


@pytest.fixture(scope="module")
def lora(tiny_models):
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_models["policy"]),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    config = json.loads(json.dumps(model.peft_config["default"].to_dict(), default=sorted))  # sets → lists
    return get_peft_model_state_dict(model), config


def long_request(prompts: int, n: int = 4, max_tokens: int = 200) -> rollout_pb2.GenerateRequest:
    """Minutes of decoding for the tiny model with 4-row batches (min_tokens: no early EOS)."""
    return rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=[5 + i % 50, 6, 7]) for i in range(prompts)],
        n=n,
        sampling=rollout_pb2.SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens),
    )


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def assert_engine_idle_soon(server, client, since: float) -> None:
    """A small Generate completes within a few seconds of ``since``: the scheduler runs one engine
    batch at a time, so it starts only once the abandoned request's work has stopped."""
    assert len(client.generate(PROMPT, n=1, sampling={"max_tokens": 2}, timeout_s=30)) == 1
    assert time.monotonic() - since < 3.0
    wait_for(lambda: server.core.generates_in_flight == 0, 5)


# ------------------------------------------------------------------------------ bounded work
def test_a_large_generate_is_decoded_and_encoded_off_the_event_loop(stub, monkeypatch):
    threads: dict[str, list[threading.Thread]] = {"decode": [], "encode": []}

    def recorded(name, convert):
        def run(message):
            threads[name].append(threading.current_thread())
            return convert(message)

        return run

    for name in threads:
        function = f"{name}_generate_{'request' if name == 'decode' else 'response'}"
        monkeypatch.setattr(rollout_codec, function, recorded(name, getattr(rollout_codec, function)))
    prompt = rollout_pb2.Prompt(token_ids=[5, 6, 7])
    small = rollout_pb2.GenerateRequest(
        prompts=[prompt], n=1, sampling=rollout_pb2.SamplingParams(max_tokens=2)
    )
    # More prompts than are decoded inline, and more completion tokens than are encoded inline.
    tokens = INLINE_TOKENS // (INLINE_PROMPTS + 1) + 1
    sampling = rollout_pb2.SamplingParams(max_tokens=tokens, min_tokens=tokens)
    large = rollout_pb2.GenerateRequest(prompts=[prompt] * (INLINE_PROMPTS + 1), n=1, sampling=sampling)
    assert len(stub.Generate(small).completions) == 1
    assert sum(len(c.token_ids) for c in stub.Generate(large, timeout=120).completions) > INLINE_TOKENS
    (loop, decoded_large), (encoded_small, encoded_large) = threads["decode"], threads["encode"]
    assert encoded_small is loop and decoded_large is not loop and encoded_large is not loop


def test_an_expired_generate_stops_every_prompt_and_sequence(server, client, stub):
    # 1024 prompts × n 4 = 4096 sequences in 1024 engine batches of 4.
    code, _ = failure(lambda: stub.Generate(long_request(1024), timeout=1.0))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_engine_idle_soon(server, client, time.monotonic())


def test_a_cancelled_generate_stops_every_prompt_and_sequence(server, client, stub):
    forwards = []
    hook = server.core.engine.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        call = stub.Generate.future(long_request(1024), timeout=120)
        wait_for(lambda: len(forwards) > 20)  # decoding, well past the first batch's prefill
        assert call.cancel()
        cancelled = time.monotonic()
        assert_engine_idle_soon(server, client, cancelled)
    finally:
        hook.remove()


def test_limits_are_resource_exhausted_naming_the_limit(server, client, stub):
    code, details = failure(lambda: client.generate(PROMPT * 8, n=1024, sampling={"max_tokens": 200}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_tokens" in details
    code, details = failure(lambda: client.generate(PROMPT * 4097, n=1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_prompts" in details
    code, details = failure(lambda: client.generate(PROMPT * 1024, n=1024, sampling={"max_tokens": 1}))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_sequences" in details

    calls = [stub.Generate.future(long_request(64), timeout=120) for _ in range(MAX_CONCURRENT)]
    try:
        wait_for(lambda: server.core.generates_in_flight == MAX_CONCURRENT)
        code, details = failure(lambda: client.generate(PROMPT, n=1, sampling={"max_tokens": 2}))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent_generates" in details
    finally:
        for call in calls:
            call.cancel()
    cancelled = time.monotonic()
    # The slots come back once the server has seen the cancellations (they travel on their own streams).
    wait_for(lambda: server.core.generates_in_flight == 0, 5)
    assert_engine_idle_soon(server, client, cancelled)


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(client):
    # 1 MB of text: the tiny tokenizer would spend ~5 s on it (holding the GIL for long spells).
    code, details = failure(lambda: client.generate(["ab " * 350_000], n=1, timeout_s=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("prompts[0]:")
    assert "characters cannot fit" in details


# ------------------------------------------------------------------------ numerical validity
@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": 1e-30}, "sampling.temperature"),  # logits / T overflows float32
        ({"temperature": 1e-45}, "sampling.temperature"),  # a float32 denormal
        ({"temperature": 1e30}, "sampling.temperature"),
        ({"temperature": float("nan")}, "sampling.temperature"),
        ({"temperature": float("inf")}, "sampling.temperature"),
        ({"temperature": -1.0}, "sampling.temperature"),
        ({"top_p": float("nan")}, "sampling.top_p"),
        ({"top_p": 1.5}, "sampling.top_p"),
        ({"top_k": -7}, "sampling.top_k"),
        ({"min_p": float("nan")}, "sampling.min_p"),
        ({"min_p": 2.0}, "sampling.min_p"),
        ({"repetition_penalty": float("nan")}, "sampling.repetition_penalty"),
        ({"repetition_penalty": 1e-40}, "sampling.repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "sampling.repetition_penalty"),
        ({"stop": ["x"] * 100}, "sampling.stop"),
    ],
)
def test_sampling_values_that_break_the_arithmetic_are_invalid_argument(client, sampling, field):
    code, details = failure(lambda: client.generate(PROMPT, n=1, sampling=sampling))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}:")


def test_greedy_and_the_temperature_bounds_give_finite_logprobs(client):
    for temperature in (0.0, 0.01, 100.0):
        results = client.generate(PROMPT, n=2, sampling={"max_tokens": 8, "temperature": temperature})
        assert all(torch.isfinite(torch.tensor(r.logprobs)).all() for r in results)
        assert all(0 <= t < 513 for r in results for t in r.token_ids)


def bad_updates(lora) -> list[tuple[str, dict, dict | str | None, str]]:
    """(format, tensors, adapter config, field in the details) of updates that must be refused."""
    tensors, config = lora
    a_name = next(k for k in tensors if k.endswith("lora_A.weight"))
    norm = "model.norm.weight"
    return [
        (
            "lora",
            tensors,
            json.dumps({**config, "lora_alpha": float("nan")}, default=sorted),
            "adapter_config_json",
        ),
        (
            "lora",
            tensors,
            json.dumps({**config, "lora_alpha": float("inf")}, default=sorted),
            "adapter_config_json",
        ),
        ("lora", tensors, {**config, "r": 0}, "adapter_config_json"),
        ("lora", tensors, {**config, "r": -4}, "adapter_config_json"),
        ("lora", {**tensors, a_name: torch.tensor(0.5)}, config, "data"),  # a 0-dim lora_A
        ("lora", {**tensors, a_name: torch.zeros(0, 128)}, config, "data"),  # rank 0
        ("lora", {**tensors, a_name: tensors[a_name].to(torch.float8_e4m3fn)}, config, "data"),
        ("lora", {**tensors, a_name: torch.full_like(tensors[a_name], float("nan"))}, config, "data"),
        ("state_dict", {norm: torch.ones(128, dtype=torch.float8_e5m2)}, None, "data"),
        ("state_dict", {norm: torch.ones(128, dtype=torch.float8_e4m3fn)}, None, "data"),
        ("state_dict", {norm: torch.ones(128, dtype=torch.bool)}, None, "data"),
        ("state_dict", {norm: torch.ones(128, dtype=torch.int32)}, None, "data"),
        ("state_dict", {norm: torch.ones(128, dtype=torch.float64)}, None, "data"),
        ("state_dict", {norm: torch.tensor(1.0)}, None, "data"),
        ("state_dict", {norm: torch.ones(0)}, None, "data"),
        ("state_dict", {norm: torch.full((128,), float("inf"))}, None, "data"),
    ]


def test_non_finite_configs_odd_dtypes_and_degenerate_tensors_are_refused(client, lora):
    before = client.generate(PROMPT, n=1, sampling=GREEDY)
    version = client.status().policy_version
    for fmt, tensors, config, field in bad_updates(lora):
        code, details = failure(
            lambda fmt=fmt, tensors=tensors, config=config: client.push_weights(
                encode(tensors), version + 1, fmt, config
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (fmt, details)
        assert details.startswith(f"{field}:"), details
    assert client.status().policy_version == version
    after = client.generate(PROMPT, n=1, sampling=GREEDY)
    assert [r.token_ids for r in after] == [r.token_ids for r in before]  # nothing was applied


def test_weights_that_overflow_fail_generate_instead_of_returning_nan(client, base_state):
    version = client.status().policy_version + 1
    huge = {"model.norm.weight": torch.full((128,), 3e38)}  # finite, but the logits overflow
    assert client.push_state_dict(huge, version).policy_version == version
    code, details = failure(lambda: client.generate(PROMPT, n=2, sampling={"max_tokens": 4}))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "non-finite logprob" in details
    client.push_state_dict(base_state, version + 1)
    results = client.generate(PROMPT, n=2, sampling={"max_tokens": 4})
    assert all(torch.isfinite(torch.tensor(r.logprobs)).all() for r in results)


# ------------------------------------------------------------------------------ LoadWeights
@pytest.fixture(scope="module")
def weight_dirs(weights_root, tmp_path_factory, base_state):
    """Directories under the root: a good state dict, and every kind of hostile file."""
    good = weights_root / "good"
    good.mkdir()
    (good / "model.safetensors").write_bytes(
        encode({"model.norm.weight": base_state["model.norm.weight"]}).to_bytes()
    )
    fifo = weights_root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "model.safetensors")  # open() blocks until a writer comes: never
    fifo_lora = weights_root / "fifo_lora"
    fifo_lora.mkdir()
    (fifo_lora / "adapter_config.json").write_text("{}")
    os.mkfifo(fifo_lora / "adapter_model.safetensors")
    device = weights_root / "device"
    device.mkdir()
    (device / "model.safetensors").symlink_to("/dev/zero")
    subdir = weights_root / "subdir"
    (subdir / "model.safetensors").mkdir(parents=True)
    outside = tmp_path_factory.mktemp("outside")
    (outside / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    escape = weights_root / "escape"
    escape.mkdir()
    (escape / "model.safetensors").symlink_to(outside / "model.safetensors")
    (weights_root / "outside_link").symlink_to(outside)
    too_big = weights_root / "too_big"
    too_big.mkdir()
    with open(too_big / "model.safetensors", "wb") as f:
        f.truncate(MAX_WEIGHT_BYTES + 1)  # sparse: no disk used
    return {"outside": outside}


@pytest.mark.parametrize(
    ("path", "code", "why"),
    [
        ("fifo", grpc.StatusCode.INVALID_ARGUMENT, "not a regular file"),
        ("fifo_lora", grpc.StatusCode.INVALID_ARGUMENT, "not a regular file"),
        ("subdir", grpc.StatusCode.INVALID_ARGUMENT, "not a regular file"),
        ("good/model.safetensors", grpc.StatusCode.INVALID_ARGUMENT, "not a directory"),
        ("missing", grpc.StatusCode.INVALID_ARGUMENT, "not a directory"),
        ("device", grpc.StatusCode.PERMISSION_DENIED, "outside"),  # a symlink to /dev/zero
        ("/dev", grpc.StatusCode.PERMISSION_DENIED, "outside"),
        ("/etc", grpc.StatusCode.PERMISSION_DENIED, "outside"),
        ("escape", grpc.StatusCode.PERMISSION_DENIED, "outside"),  # a file symlinked out of the root
        ("outside_link", grpc.StatusCode.PERMISSION_DENIED, "outside"),  # a directory symlinked out
        ("good/../..", grpc.StatusCode.PERMISSION_DENIED, "outside"),
        ("too_big", grpc.StatusCode.RESOURCE_EXHAUSTED, "max_weight_bytes"),
        ("", grpc.StatusCode.INVALID_ARGUMENT, "non-empty"),
    ],
)
def test_load_weights_reads_only_regular_files_under_the_root(client, weight_dirs, path, code, why):
    version = client.status().policy_version + 1
    # A deadline so that a hang (a FIFO opened blocking) fails instead of stalling the suite.
    got, details = failure(lambda: client.load_weights(path, version, timeout_s=20))
    assert got == code, details
    assert details.startswith("path:") and why in details
    assert client.status().policy_version == version - 1


def test_load_weights_outside_the_root_even_by_absolute_path(client, weight_dirs, weights_root):
    version = client.status().policy_version + 1
    code, _ = failure(lambda: client.load_weights(weight_dirs["outside"], version))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    applied = client.load_weights(weights_root / "good", version)  # absolute, inside: fine
    assert applied.policy_version == version and applied.tensors_loaded == 1
    assert client.load_weights("good", version + 1).policy_version == version + 1  # relative to the root


def test_health_answers_while_a_large_load_is_read(server, client, weights_root):
    big = weights_root / "big"
    big.mkdir()
    with open(big / "model.safetensors", "wb") as f:
        f.truncate(MAX_WEIGHT_BYTES)  # read whole (256 MiB), then refused: a header of zeros
    outcome: list[grpc.StatusCode] = []

    def load() -> None:
        outcome.append(failure(lambda: client.load_weights(big, client.status().policy_version + 1))[0])

    loader = threading.Thread(target=load)
    latencies = []
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        loader.start()
        while loader.is_alive():
            start = time.perf_counter()
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            latencies.append(time.perf_counter() - start)
            assert status == health_pb2.HealthCheckResponse.SERVING
    loader.join()
    assert outcome == [grpc.StatusCode.INVALID_ARGUMENT]
    assert len(latencies) >= 10  # answered many times while the load was in flight, not after it
    assert max(latencies) < 1.0


# ------------------------------------------------------------------------------------- images
@pytest.mark.parametrize(
    ("image", "why"),
    [
        (encoded(picture(), "PNG")[:40], "image"),
        (png_bomb(), "max_image_pixels"),
        (encoded(picture(), "PNG"), "no images"),
    ],
    ids=["truncated", "bomb", "text-only-model"],
)
def test_an_image_part_is_invalid_argument_naming_it_and_the_server_goes_on(client, image, why):
    prompt = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Count"},
                {"type": "image", "data": image, "media_type": "image/png"},
            ],
        }
    ]
    code, details = failure(lambda: client.generate([prompt], n=1, sampling=GREEDY))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith("prompts[0].messages[0].parts[1].image:") and why in details, details
    assert len(client.generate(PROMPT, n=1, sampling=GREEDY)) == 1
