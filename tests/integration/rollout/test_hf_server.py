"""The rollout service with the HF engine behind a real gRPC server on 127.0.0.1, driven by the
RolloutClient the trainer uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest
import torch
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from grpo_runtime.config import ServerConfig
from rollout_service.client import RolloutClient
from rollout_service.settings import RolloutSettings
from rollout_service.types import FinishReason, WeightFormat
from rollout_service.weight_plane.payload import encode
from tests.integration.rollout.fixtures import rollout_server_thread
from tests.support.statuses import failure

PROMPTS = ["What is 12 + 7?", [{"role": "user", "content": "Compute 3 * 4 - 5."}], [5, 6, 7, 8]]


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    # LoadWeights reads only under weights_root: here every test's tmp_path.
    settings = RolloutSettings(
        model=str(tiny_models["policy"]), engine="hf", weights_root=str(tmp_path_factory.getbasetemp())
    )
    with rollout_server_thread(settings) as running:
        yield running


def test_generate_through_grpc(client):
    results = client.generate(
        PROMPTS, n=2, sampling={"max_tokens": 10, "seed": 3, "temperature": 0.9}, prompt_ids=["a", "b", "c"]
    )
    assert [r.prompt_id for r in results] == ["a", "a", "b", "b", "c", "c"]
    assert results[4].prompt_token_ids == [5, 6, 7, 8]
    assert all(len(r.logprobs) == len(r.token_ids) for r in results)
    again = client.generate(PROMPTS, n=2, sampling={"max_tokens": 10, "seed": 3, "temperature": 0.9})
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    stopped = client.generate(PROMPTS[:1], n=6, sampling={"max_tokens": 20, "stop": ["e"], "seed": 1})
    assert any(r.finish_reason == FinishReason.STOP for r in stopped)
    assert all("e" not in r.text for r in stopped)


@pytest.mark.parametrize(
    ("prompts", "n", "sampling", "field"),
    [
        ([], 1, {}, "prompts"),
        (["x"], 0, {}, "n"),
        (["x"], 1, {"max_tokens": 100_000}, "sampling.max_tokens"),
        (["x"], 1, {"top_p": 0.0}, "sampling.top_p"),
        (["x"], 1, {"temperature": -1.0}, "sampling.temperature"),
        (["x", ""], 1, {}, "prompts[1]"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(client, prompts, n, sampling, field):
    code, details = failure(lambda: client.generate(prompts, n=n, sampling=sampling))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}:")


def test_deadline_stops_generation(client):
    code, _ = failure(lambda: client.generate(PROMPTS, n=64, sampling={"max_tokens": 480}, timeout_s=0.3))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    start = time.perf_counter()
    client.generate(PROMPTS[:1], n=1, sampling={"max_tokens": 2})
    assert time.perf_counter() - start < 5  # the abandoned batch stopped between decode steps


def test_weight_updates_sleep_and_status(client, tiny_models, tmp_path):
    sampling = {"max_tokens": 12, "seed": 11, "temperature": 0.8}
    before = client.generate(PROMPTS, n=2, sampling=sampling)
    torch.manual_seed(0)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_models["policy"]),
        LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    version = client.status().policy_version + 1
    small_chunks = RolloutClient(client.target, chunk_bytes=1024)
    applied = small_chunks.push_lora(tmp_path / "adapter", version=version)  # dozens of chunks
    small_chunks.close()
    assert applied.policy_version == version and applied.tensors_loaded == 8
    after = client.generate(PROMPTS, n=2, sampling=sampling)
    assert {r.policy_version for r in after} == {version}
    assert [r.token_ids for r in after] != [r.token_ids for r in before]

    # A corrupt payload (bad checksum) and a wrong shape are refused; the adapter keeps serving.
    payload = (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes()
    with grpc.insecure_channel(client.target) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        code, details = failure(lambda: stub.UpdateWeights(iter([bad_chunk(payload, version + 1)])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("sha256:")
    code, details = failure(
        lambda: client.push_state_dict({"model.norm.weight": torch.ones(3)}, version=version + 1)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("data:")
    assert [r.token_ids for r in client.generate(PROMPTS, n=2, sampling=sampling)] == [
        r.token_ids for r in after
    ]

    loaded = client.load_weights(tmp_path / "adapter", version=version + 1)
    assert loaded.policy_version == version + 1

    client.sleep(1)
    code, details = failure(lambda: client.generate(PROMPTS, n=1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "asleep" in details
    status = client.status()
    assert (status.engine, status.device, status.sleep_level) == ("hf", "cpu", 1)
    assert status.memory.rss_bytes > 0 and status.max_model_len == 512
    assert client.wake_up().weights_valid
    status = client.status()
    assert status.sleep_level == 0 and status.weight_format == WeightFormat.LORA_ADAPTER
    assert [r.token_ids for r in client.generate(PROMPTS, n=2, sampling=sampling)] == [
        r.token_ids for r in after
    ]


def bad_chunk(payload: bytes, version: int) -> rollout_pb2.WeightChunk:
    return rollout_pb2.WeightChunk(
        version=version,
        format=rollout_pb2.WEIGHT_FORMAT_LORA_ADAPTER,
        adapter_config_json="{}",
        total_bytes=len(payload),
        sha256="0" * 64,
        data=payload,
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["missing", "orm"])
def test_service_refuses_a_bad_model_with_one_line(tiny_models, tmp_path, kind):
    model = tmp_path / "nope" if kind == "missing" else tiny_models["orm"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "rollout_service", "--port", "0", "--model", str(model), "--engine", "hf"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rollout_service: config error: model:")


def test_push_lora_tensors_with_a_peft_config_dict(client, tiny_models):
    """The trainer's path: tensors from get_peft_model_state_dict and LoraConfig.to_dict()."""
    torch.manual_seed(3)
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_models["policy"]),
        LoraConfig(r=2, lora_alpha=4, target_modules=["o_proj"], init_lora_weights=False),
    )
    version = client.status().policy_version + 1
    applied = client.push_lora(
        get_peft_model_state_dict(peft_model), peft_model.peft_config["default"].to_dict(), version
    )
    assert applied.policy_version == version and applied.tensors_loaded == 4
    assert {r.policy_version for r in client.generate(PROMPTS[:1], n=2)} == {version}


def test_admin_rpcs_need_the_token(tiny_models):
    settings = RolloutSettings(model=str(tiny_models["policy"]), engine="hf")
    config = ServerConfig(host="127.0.0.1", port=0, admin_token="s3cret")
    with rollout_server_thread(settings, config) as running:
        with RolloutClient(running.address) as anonymous:
            assert len(anonymous.generate(["hi"], n=1, sampling={"max_tokens": 2})) == 1  # public
            code, _ = failure(lambda: anonymous.sleep(1))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        with RolloutClient(running.address, admin_token="s3cret") as admin:
            assert admin.sleep(1).level == 1
            assert admin.wake_up().weights_valid


def test_full_state_dict_streams_exactly_and_all_or_nothing(server, client, tiny_models):
    """A full state dict cut at chunk boundaries that fall inside tensors arrives bit for bit;
    a stream longer than its declared size is refused and the weights stay as they were."""
    base = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).state_dict()
    base.pop("lm_head.weight")  # tied to the embeddings
    scaled = {name: tensor * 1.25 for name, tensor in base.items()}
    version = client.status().policy_version + 1
    with RolloutClient(client.target, chunk_bytes=64 * 1024 + 3) as odd_chunks:
        applied = odd_chunks.push_state_dict(scaled, version=version)
    assert applied.policy_version == version and applied.tensors_loaded == len(scaled)
    assert applied.bytes_received == encode(scaled).nbytes and applied.apply_seconds > 0
    live = server.core.engine.model.state_dict()
    assert all(torch.equal(live[name], tensor) for name, tensor in scaled.items())
    payload = encode(scaled)  # encoded and hashed once, pushed as often as needed (replicas)
    version += 1
    assert client.push_weights(payload, version, "state_dict").policy_version == version

    other = encode({name: tensor * 0.5 for name, tensor in base.items()})
    data = other.to_bytes()
    header = rollout_pb2.WeightChunk(
        version=version + 1,
        format=rollout_pb2.WEIGHT_FORMAT_STATE_DICT,
        total_bytes=len(data) - 5,
        sha256=other.sha256,
    )
    chunks = [rollout_pb2.WeightChunk(data=data[i : i + 4096]) for i in range(0, len(data), 4096)]
    chunks[0].MergeFrom(header)
    with grpc.insecure_channel(client.target) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        code, details = failure(lambda: stub.UpdateWeights(iter(chunks)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("total_bytes:")
    live = server.core.engine.model.state_dict()
    assert all(torch.equal(live[name], tensor) for name, tensor in scaled.items())
    assert client.status().policy_version == version
