"""The weight data plane on a real rollout server (HF engine, 127.0.0.1): shared-memory and gloo
pushes serve exactly what UpdateWeights of the same tensors serves; bad manifests are refused
naming the field while the old weights keep serving; the trainer's sender picks shared memory on
the same host and the stream when the replica has no shared-memory directory."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_runtime.config import ServerConfig
from rollout_service.client import RolloutClient
from rollout_service.settings import RolloutSettings
from rollout_service.types import WeightFormat, WeightTransport
from rollout_service.weight_plane.buckets import fill_bucket, plan_buckets
from rollout_service.weight_plane.distributed import BroadcastGroup, GroupSpec
from rollout_service.weight_plane.manifest import TensorLayout
from rollout_service.weight_plane.shared_memory import BucketFiles
from tests.integration.rollout.fixtures import rollout_server_thread
from tests.support.statuses import failure
from trainer_service.rollout.weight_transport import WeightTransports, free_port

PROMPTS = ["What is 12 + 7?", [5, 6, 7, 8]]
SAMPLING = {"max_tokens": 10, "seed": 5, "temperature": 0.9}


@pytest.fixture(scope="module")
def shm_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weight-shm")


@pytest.fixture(scope="module")
def server(tiny_models, shm_dir):
    settings = RolloutSettings(model=str(tiny_models["policy"]), engine="hf", weight_shm_dir=str(shm_dir))
    with rollout_server_thread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def perturbed(tiny_models):
    """Two state dicts of new weights (every tensor changed; the tied lm_head is the embedding)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    base = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    generator = torch.Generator().manual_seed(0)
    return [
        {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in base.items()} for _ in range(2)
    ]


def _next_version(client: RolloutClient) -> int:
    return client.status().policy_version + 1


def _tokens(client: RolloutClient) -> list[list[int]]:
    return [r.token_ids for r in client.generate(PROMPTS, n=2, sampling=SAMPLING)]


def test_status_reports_the_transports_and_channel_is_needed(client, shm_dir):
    status = client.status()
    assert status.weight_transport == WeightTransport.GRPC_STREAM
    assert WeightTransport.SHARED_MEMORY in status.weight_transports
    assert WeightTransport.TORCH_DISTRIBUTED in status.weight_transports
    assert status.weight_shm_dir == str(shm_dir.resolve())
    assert (shm_dir / f".grpo-weight-shm-{status.weight_shm_token}").read_text() == status.weight_shm_token
    plan = plan_buckets({"model.norm.weight": torch.ones(128)})
    code, _ = failure(lambda: client.push_from_channel(plan, _next_version(client), "state_dict"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def test_shared_memory_push_serves_what_the_stream_serves(client, shm_dir, perturbed):
    before = _tokens(client)
    files = BucketFiles(shm_dir)
    try:
        assert client.open_weight_channel(WeightTransport.SHARED_MEMORY) == WeightTransport.SHARED_MEMORY
        assert client.status().weight_transport == WeightTransport.SHARED_MEMORY
        # Small buckets: many tensors per bucket and many buckets.
        plan = plan_buckets(perturbed[0], bucket_bytes=256 << 10)
        assert len(plan.bucket_bytes) > 2
        version = _next_version(client)
        applied = client.push_from_channel(
            plan, version, "state_dict", bucket_files=files.write(perturbed[0], plan)
        )
        assert applied.policy_version == version
        assert applied.tensors_loaded == len(perturbed[0])
        assert applied.bytes_received == plan.total_bytes
        assert applied.transport == WeightTransport.SHARED_MEMORY
        via_shm = _tokens(client)
        assert via_shm != before
        client.push_state_dict(perturbed[1], version + 1)
        client.push_state_dict(perturbed[0], version + 2)
        assert _tokens(client) == via_shm
    finally:
        files.close()
    assert not [p for p in shm_dir.iterdir() if p.suffix == ".bucket"]


@pytest.mark.parametrize(
    ("mutate", "field", "code"),
    [
        (lambda t: {**t, "dtype": "int8"}, "tensors[1].dtype", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda t: {**t, "shape": (2, 64)}, "tensors[1].shape", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda t: {**t, "shape": (3, 3)}, "tensors[1].nbytes", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda t: {**t, "offset": 0}, "tensors[1].offset", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda t: {**t, "offset": 1 << 30}, "tensors[1].offset", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda t: {**t, "bucket": 7}, "tensors[1].bucket", grpc.StatusCode.INVALID_ARGUMENT),
        (lambda t: {**t, "name": "model.nope"}, "tensors[1].name", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_manifest_names_the_field_and_old_weights_keep_serving(client, shm_dir, mutate, field, code):
    tensors = {"model.norm.weight": torch.ones(128), "model.layers.0.input_layernorm.weight": torch.ones(128)}
    plan = plan_buckets(tensors)
    bad = plan.layouts[1].__dict__ | mutate(plan.layouts[1].__dict__)
    plan = type(plan)((plan.layouts[0], TensorLayout(**bad)), plan.bucket_bytes)
    files = BucketFiles(shm_dir)
    try:
        names = files.write(tensors, plan_buckets(tensors))
        client.open_weight_channel(WeightTransport.SHARED_MEMORY)
        before = client.status().policy_version
        got, details = failure(
            lambda: client.push_from_channel(plan, before + 1, "state_dict", bucket_files=names)
        )
        assert got == code
        assert details.startswith(f"{field}:")
        assert client.status().policy_version == before
    finally:
        files.close()


def test_bucket_files_are_confined_to_the_directory(client, shm_dir, tmp_path):
    tensors = {"model.norm.weight": torch.ones(128)}
    plan = plan_buckets(tensors)
    outside = BucketFiles(tmp_path)
    inside = BucketFiles(shm_dir)
    try:
        (name,) = outside.write(tensors, plan)
        (shm_dir / "link.bucket").symlink_to(tmp_path / name)
        client.open_weight_channel(WeightTransport.SHARED_MEMORY)
        version = _next_version(client)
        for files, field in [
            ((f"../{tmp_path.name}/{name}",), "bucket_files[0]"),
            ((str(tmp_path / name),), "bucket_files[0]"),
            (("link.bucket",), "bucket_files[0]"),
            (("missing.bucket",), "bucket_files[0]"),
            ((), "bucket_files"),
        ]:
            code, details = failure(
                lambda f=files: client.push_from_channel(plan, version, "state_dict", bucket_files=f)
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT, files
            assert details.startswith(f"{field}:"), details
        # NaN in the bytes: the same validation as UpdateWeights.
        bad = {"model.norm.weight": torch.full((128,), float("nan"))}
        code, details = failure(
            lambda: client.push_from_channel(
                plan, version, "state_dict", bucket_files=inside.write(bad, plan)
            )
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "NaN" in details
        assert client.status().policy_version == version - 1
    finally:
        (shm_dir / "link.bucket").unlink(missing_ok=True)
        outside.close()
        inside.close()


def test_gloo_push_serves_what_the_stream_serves(client, perturbed):
    spec = GroupSpec(f"tcp://127.0.0.1:{free_port('127.0.0.1')}", 0, 2, "gloo", 30.0)
    hosted: list[BroadcastGroup] = []
    host = threading.Thread(target=lambda: hosted.append(BroadcastGroup(spec)))
    host.start()
    transport = client.open_weight_channel(
        WeightTransport.TORCH_DISTRIBUTED,
        init_method=spec.init_method,
        rank=1,
        world_size=2,
        join_timeout_s=30,
    )
    host.join()
    assert transport == WeightTransport.TORCH_DISTRIBUTED
    assert client.status().weight_transport == WeightTransport.TORCH_DISTRIBUTED
    group = hosted[0]
    try:
        client.push_state_dict(perturbed[1], _next_version(client))
        version = _next_version(client)
        plan = plan_buckets(perturbed[0], bucket_bytes=1 << 20)
        result: list = []
        call = threading.Thread(
            target=lambda: result.append(client.push_from_channel(plan, version, WeightFormat.STATE_DICT))
        )
        call.start()
        buckets = [torch.empty(size, dtype=torch.uint8) for size in plan.bucket_bytes]
        group.broadcast(buckets, lambda index, bucket: fill_bucket(bucket, plan, index, perturbed[0]))
        call.join(60)
        assert result and result[0].transport == WeightTransport.TORCH_DISTRIBUTED
        via_group = _tokens(client)
        client.push_state_dict(perturbed[1], version + 1)
        client.push_state_dict(perturbed[0], version + 2)
        via_stream = _tokens(client)
        assert via_group == via_stream
        # A manifest refused before any byte moved leaves the group: FAILED_PRECONDITION after it.
        bad = type(plan)((TensorLayout("model.norm.weight", "float32", (5,), 0, 0, 20),), (20,))
        code, details = failure(lambda: client.push_from_channel(bad, version + 3, "state_dict"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("tensors[0].shape:")
        assert client.status().weight_transport == WeightTransport.GRPC_STREAM
    finally:
        group.close()
        client.close_weight_channel()


def test_trainer_sender_picks_shared_memory_then_falls_back(client, server, perturbed, tiny_models):
    sender = WeightTransports("auto", bucket_bytes=4 << 20)
    try:
        version = _next_version(client)
        (outcome,) = sender.push([(server.address, client)], version, perturbed[0], None)
        assert not isinstance(outcome, Exception), outcome
        assert sender.last[server.address].transport == WeightTransport.SHARED_MEMORY
        # The replica lost its channel (a restart would too): the same push goes over the stream.
        client.close_weight_channel()
        (outcome,) = sender.push([(server.address, client)], version + 1, perturbed[1], None)
        assert not isinstance(outcome, Exception), outcome
        assert sender.last[server.address].transport == WeightTransport.GRPC_STREAM
        assert client.status().policy_version == version + 1
    finally:
        sender.close()
    settings = RolloutSettings(model=str(tiny_models["policy"]), engine="hf")
    with rollout_server_thread(settings) as plain, RolloutClient(plain.address, timeout_s=60) as other:
        sender = WeightTransports("auto")
        try:
            (outcome,) = sender.push([(plain.address, other)], 1, perturbed[0], None)
            assert not isinstance(outcome, Exception), outcome
            assert sender.last[plain.address].transport == WeightTransport.GRPC_STREAM
        finally:
            sender.close()
        # Configured for a group, the trainer hosts one with this replica (buffers kept for the 2nd push).
        sender = WeightTransports("distributed", bucket_bytes=256 << 10)
        try:
            for version, weights in ((2, perturbed[1]), (3, perturbed[0])):
                (outcome,) = sender.push([(plain.address, other)], version, weights, None)
                assert not isinstance(outcome, Exception), outcome
                assert sender.last[plain.address].transport == WeightTransport.TORCH_DISTRIBUTED
            via_group = _tokens(other)
        finally:
            sender.close()
        assert other.status().weight_transport == WeightTransport.GRPC_STREAM
        other.push_state_dict(perturbed[1], 4)
        other.push_state_dict(perturbed[0], 5)
        assert _tokens(other) == via_group


def _lora(tiny_models, seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """A rank-4 PEFT adapter on q_proj and v_proj of every layer (random A and B)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, weight in model.state_dict().items():
        if name.endswith(("q_proj.weight", "v_proj.weight")):
            stem = f"base_model.model.{name.removesuffix('.weight')}"
            out_features, in_features = weight.shape
            tensors[f"{stem}.lora_A.weight"] = 0.1 * torch.randn(4, in_features, generator=generator)
            tensors[f"{stem}.lora_B.weight"] = 0.1 * torch.randn(out_features, 4, generator=generator)
    return tensors, {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def test_lora_over_shared_memory_serves_what_the_stream_serves(client, server, tiny_models):
    adapter, config = _lora(tiny_models, 3)
    other, _ = _lora(tiny_models, 4)
    sender = WeightTransports("shared_memory")
    try:
        version = _next_version(client)
        (outcome,) = sender.push([(server.address, client)], version, adapter, config)
        assert not isinstance(outcome, Exception), outcome
        assert sender.last[server.address].transport == WeightTransport.SHARED_MEMORY
        assert client.status().weight_format == WeightFormat.LORA_ADAPTER
        via_shm = _tokens(client)
        client.push_lora(other, config, version + 1)
        client.push_lora(adapter, config, version + 2)
        assert _tokens(client) == via_shm
    finally:
        sender.close()
    assert client.status().weight_transport == WeightTransport.GRPC_STREAM  # the sender closed it


def test_a_join_nobody_answers_does_not_stall_other_calls(client):
    port = free_port("127.0.0.1")  # nobody listens there
    outcome: list = []

    def join() -> None:
        outcome.append(
            failure(
                lambda: client.open_weight_channel(
                    WeightTransport.TORCH_DISTRIBUTED,
                    init_method=f"tcp://127.0.0.1:{port}",
                    rank=1,
                    world_size=2,
                    join_timeout_s=5,
                )
            )
        )

    waiting = threading.Thread(target=join)
    waiting.start()
    assert len(client.generate(PROMPTS, n=1, sampling={"max_tokens": 2})) == 2  # served meanwhile
    assert client.status().weight_transport == WeightTransport.GRPC_STREAM
    waiting.join(120)
    assert outcome and outcome[0][0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert outcome[0][1].startswith("timeout_seconds:")


def test_channel_rpcs_need_the_admin_token(tiny_models, tmp_path):
    settings = RolloutSettings(model=str(tiny_models["policy"]), engine="hf", weight_shm_dir=str(tmp_path))
    config = ServerConfig(host="127.0.0.1", port=0, admin_token="s3cret")
    with rollout_server_thread(settings, config) as running, RolloutClient(running.address) as anonymous:
        plan = plan_buckets({"model.norm.weight": torch.ones(128)})
        for call in (
            lambda: anonymous.open_weight_channel(WeightTransport.SHARED_MEMORY),
            lambda: anonymous.push_from_channel(plan, 1, "state_dict", bucket_files=("x.bucket",)),
            lambda: anonymous.close_weight_channel(),
        ):
            assert failure(call)[0] == grpc.StatusCode.UNAUTHENTICATED
        # GetStatus is public, but the shared-memory directory and its token are for the trainer only.
        public = anonymous.status()
        assert (public.weight_shm_dir, public.weight_shm_token) == ("", "")
        assert WeightTransport.SHARED_MEMORY in public.weight_transports
        with RolloutClient(running.address, admin_token="s3cret") as admin:
            status = admin.status()
        assert status.weight_shm_dir == str(tmp_path.resolve())
        assert (
            tmp_path / f".grpo-weight-shm-{status.weight_shm_token}"
        ).read_text() == status.weight_shm_token
        with RolloutClient(running.address, admin_token="wrong") as impostor:
            assert impostor.status().weight_shm_dir == ""
    assert not list(tmp_path.iterdir())  # the token file goes with the replica


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_engine_applies_a_shared_memory_push(tiny_models, tmp_path, perturbed):
    settings = RolloutSettings(
        model=str(tiny_models["policy"]), engine="vllm", max_model_len=512, weight_shm_dir=str(tmp_path)
    )
    with rollout_server_thread(settings) as running, RolloutClient(running.address, timeout_s=300) as vllm:
        sender = WeightTransports("auto")
        try:
            (outcome,) = sender.push([(running.address, vllm)], 1, perturbed[0], None)
            assert not isinstance(outcome, Exception), outcome
            assert sender.last[running.address].transport == WeightTransport.SHARED_MEMORY
            via_shm = _tokens(vllm)
            vllm.push_state_dict(perturbed[1], 2)
            vllm.push_state_dict(perturbed[0], 3)
            assert _tokens(vllm) == via_shm
        finally:
            sender.close()
