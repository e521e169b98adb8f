"""GRPO runs against REAL reward and rollout services on loopback, with the tiny policy model.

- in process (``run_job``, what ``python -m trainer_service train`` runs): every step's completions carry the
  version the trainer pushed for that step, metrics.jsonl has one line per step, the outputs exist;
- through TrainerService on a real gRPC server: StartRun / WatchRun / GetRun / ListRuns, StopRun mid-run,
  then a resumed run that reaches the same final step; bad requests get the right status codes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from transformers import AutoTokenizer

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from rollout_service.client import RolloutClient
from rollout_service.types import WeightFormat
from tests.integration.trainer.fixtures import MODEL_ROOTS, CrashAndRestart, run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import JobEvent, RunState
from trainer_service.local.launcher import ServiceProcess, free_port, start_service
from trainer_service.server import build
from trainer_service.settings import TrainerServiceSettings
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow


def test_steps_train_on_the_version_pushed_for_them(tiny_models, services, train_file, tmp_path):
    config = parse_config(
        run_config(
            tiny_models,
            train_file,
            tmp_path / "run",
            services.reward.target,
            services.rollout.target,
            max_steps=3,
        )
    )
    events: list[JobEvent] = []
    result = run_job(config, sink=events.append)

    assert result.state is RunState.COMPLETED and result.step == result.total_steps == 3
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all("reward" in r and "loss" in r for r in records)
    # One push at train begin and one after each optimizer step; step k trains on the version pushed after
    # step k-1, so the versions of consecutive steps are consecutive.
    versions = [int(r["policy_version"]) for r in records]
    assert versions == list(range(versions[0], versions[0] + 3))
    assert result.weight_pushes == 4
    with RolloutClient(services.rollout.target) as rollout:
        assert rollout.status().policy_version == result.policy_version == versions[-1] + 1
    assert (result.output_dir / "adapter_model.safetensors").is_file()
    assert (result.output_dir / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert [e.step for e in events if e.metrics] == [1, 2, 3]


def test_full_fine_tuning_pushes_the_whole_state_dict(tiny_models, services, train_file, tmp_path):
    """lora.r = 0: every optimizer step streams the full state dict (tied embeddings included) from the
    model's own tensors; the rollout service serves each version. Its own service: the shared one keeps base
    weights for the adapter tests."""
    rollout = start_service(
        "rollout_service",
        ["--model", str(tiny_models["policy"]), "--engine", "hf"],
        port=free_port(),
        log_dir=tmp_path / "logs",
    )
    try:
        config = run_config(
            tiny_models,
            train_file,
            tmp_path / "full",
            services.reward.target,
            rollout.target,
            max_steps=2,
            model={"lora": {"r": 0}},
        )
        result = run_job(parse_config(config))
        with RolloutClient(rollout.target) as client:
            status = client.status()
    finally:
        rollout.stop()
    assert result.state is RunState.COMPLETED and result.step == 2
    assert result.weight_pushes == 3
    versions = [int(r["policy_version"]) for r in read_metrics(result.metrics_path)]
    assert versions == [versions[0], versions[0] + 1]
    assert status.policy_version == result.policy_version == versions[-1] + 1
    assert status.weight_format is WeightFormat.STATE_DICT and status.weights_valid


@pytest.fixture
async def trainer_stub(tmp_path_factory):
    """TrainerService as ``python -m trainer_service`` assembles it, on a loopback port of this process; runs
    and data may be anywhere under pytest's temporary directory."""
    tmp = tmp_path_factory.getbasetemp()
    settings = TrainerServiceSettings(
        stop_grace_s=10, runs_root=tmp, data_roots=[tmp], model_roots=MODEL_ROOTS
    )
    bindings, cleanup = await build(settings)
    async with GrpcServer(ServerConfig(port=0), bindings) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield trainer_pb2_grpc.TrainerServiceStub(channel)
        await cleanup()


async def watch(stub, run_id: str, stop_after_step: int | None = None) -> list[trainer_pb2.RunEvent]:
    events = []
    stop_sent = False
    async for event in stub.WatchRun(trainer_pb2.WatchRunRequest(run_id=run_id)):
        events.append(event)
        if stop_after_step is not None and not stop_sent and event.step >= stop_after_step and event.metrics:
            stopped = await stub.StopRun(trainer_pb2.StopRunRequest(run_id=run_id))
            assert stopped.run.state == trainer_pb2.RUN_STATE_STOPPING
            stop_sent = True
    return events


async def test_trainer_service_stop_then_resume(tiny_models, services, train_file, tmp_path, trainer_stub):
    stub = trainer_stub
    output = tmp_path / "svc"
    config_yaml = yaml.safe_dump(
        run_config(
            tiny_models,
            train_file,
            output,
            services.reward.target,
            services.rollout.target,
            max_steps=6,
            save_steps=3,
        )
    )

    first = (await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml, run_id="first"))).run_id
    assert first == "first"
    with pytest.raises(grpc.aio.AioRpcError) as duplicate:
        await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml, run_id="first"))
    assert duplicate.value.code() == grpc.StatusCode.ALREADY_EXISTS

    events = await watch(stub, first, stop_after_step=1)
    assert events[0].state == trainer_pb2.RUN_STATE_PENDING
    assert events[-1].state == trainer_pb2.RUN_STATE_STOPPED, events[-1].message
    stopped_at = events[-1].step
    assert 1 <= stopped_at < 6
    assert (output / f"checkpoint-{stopped_at}").is_dir()
    # A second watch replays the whole history and ends.
    replay = await watch(stub, first)
    assert [e.step for e in replay] == [e.step for e in events]

    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await stub.StopRun(trainer_pb2.StopRunRequest(run_id=first))
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    resumed = (await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml, resume=True))).run_id
    events = await watch(stub, resumed)
    assert events[-1].state == trainer_pb2.RUN_STATE_COMPLETED, events[-1].message
    assert events[-1].step == events[-1].total_steps == 6
    step_events = [e for e in events if e.metrics]
    assert step_events[0].step == stopped_at + 1

    info = (await stub.GetRun(trainer_pb2.GetRunRequest(run_id=resumed))).run
    assert info.state == trainer_pb2.RUN_STATE_COMPLETED and info.step == 6
    assert Path(info.output_dir) == output.resolve()
    assert "reward" in info.metrics
    listed = (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs
    assert [r.run_id for r in listed] == [first, resumed]

    records = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    versions = [int(r["policy_version"]) for r in records]
    assert versions == sorted(versions) and len(set(versions)) == 6


async def test_trainer_service_rejects_bad_requests(trainer_stub, tmp_path):
    stub = trainer_stub
    bad = yaml.safe_dump(
        {"base": "m", "data": {"train": "t"}, "training": {"optimizer": {"learning_rate": -1}}}
    )
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=bad))
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "training.optimizer.learning_rate" in invalid.value.details()
    for call, request in (
        (stub.GetRun, trainer_pb2.GetRunRequest(run_id="nope")),
        (stub.StopRun, trainer_pb2.StopRunRequest(run_id="nope")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await call(request)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        async for _ in stub.WatchRun(trainer_pb2.WatchRunRequest(run_id="nope")):
            pass
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_failed_worker_reports_failed_and_service_survives(trainer_stub, tiny_models, tmp_path):
    stub = trainer_stub
    # Valid config, but the data file does not exist: the worker fails, the service keeps serving.
    config_yaml = yaml.safe_dump(
        {
            "base": str(tiny_models["policy"]),
            "output": str(tmp_path / "fail"),
            "data": {"train": str(tmp_path / "missing.jsonl")},
            "services": {"reward": "127.0.0.1:1", "rollout": "127.0.0.1:1"},
        }
    )
    run_id = (await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml))).run_id
    events = await watch(stub, run_id)
    assert events[-1].state == trainer_pb2.RUN_STATE_FAILED
    assert events[-1].message
    # The worker's own output (the logged traceback) is kept beside the run's outputs.
    assert "missing.jsonl" in (tmp_path / "fail" / "worker.log").read_text()
    listed = (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs
    assert [r.state for r in listed] == [trainer_pb2.RUN_STATE_FAILED]


def test_two_processes_with_gloo_share_the_rollout(tiny_models, services, train_file, tmp_path):
    """torchrun with 2 CPU processes (gloo): each rank generates its share, only rank 0 pushes weights."""
    output = tmp_path / "ddp"
    path = tmp_path / "ddp.yaml"
    path.write_text(
        yaml.safe_dump(
            run_config(
                tiny_models, train_file, output, services.reward.target, services.rollout.target, max_steps=2
            )
        )
    )
    with RolloutClient(services.rollout.target) as rollout:
        before = rollout.status().policy_version
    command = [
        str(Path(sys.executable).with_name("torchrun")),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "trainer_service",
        "train",
        str(path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("completed: step 2/2") == 1  # printed by rank 0 only
    records = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    # TRL gathers token counts over ranks: step 1 counts 2 ranks × 4 completions, prompt tokens included.
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    rows = [json.loads(line) for line in train_file.read_text().splitlines()]
    shortest_prompt = min(
        len(tokenizer.apply_chat_template(row["messages"][:1], add_generation_prompt=True)["input_ids"])
        for row in rows
    )
    assert records[0]["num_tokens"] >= 8 * (shortest_prompt + records[0]["completions/min_length"])
    with RolloutClient(services.rollout.target) as rollout:
        # Pushes: train begin + one per optimizer step, from rank 0 only.
        assert rollout.status().policy_version == before + 3
    assert [int(r["policy_version"]) for r in records] == [before + 1, before + 2]


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_mode_wakes_pushes_generates_sleeps(tiny_models, services, train_file, tmp_path, level):
    """vllm_enable_sleep_mode: around each generation wake → push → generate → sleep; never generate from
    weights that were not pushed after the wake (with level 2 the engine has no valid weights until the
    push)."""
    training = {"max_steps": 2, "rollout": {"vllm_enable_sleep_mode": True, "sleep_level": level}}
    output = tmp_path / f"sleep{level}"
    config = parse_config(
        run_config(
            tiny_models, train_file, output, services.reward.target, services.rollout.target, **training
        )
    )
    with RolloutClient(services.rollout.target) as rollout:
        try:
            rollout.sleep(level=level)  # a colocated engine starts asleep while the trainer loads
            result = run_job(config)
            status = rollout.status()
        finally:
            rollout.wake_up()
            # Leave the shared service with valid base weights for the next tests (level 2 discarded them).
            rollout.load_weights(tiny_models["policy"], version=rollout.status().policy_version + 1)
    assert result.state is RunState.COMPLETED and result.step == 2
    # One push per generation (after each wake), none at train begin or after the steps.
    assert result.weight_pushes == 2
    assert status.sleep_level == level and status.policy_version == result.policy_version
    records = read_metrics(result.metrics_path)
    assert [int(r["policy_version"]) for r in records] == [result.policy_version - 1, result.policy_version]


def test_rollout_service_killed_and_restarted_mid_run(tiny_models, services, train_file, tmp_path):
    """kill -9 the rollout service after step 2 and restart it on the same port: the step waits with backoff,
    the current weights are pushed again (the new process serves its base weights), no step is lost."""
    port = free_port()
    model_args = ["--model", str(tiny_models["policy"]), "--engine", "hf"]
    logs = tmp_path / "logs"

    def start() -> ServiceProcess:
        return start_service("rollout_service", model_args, port=port, log_dir=logs)

    crash = CrashAndRestart(start(), start)
    config = run_config(
        tiny_models, train_file, tmp_path / "ft", services.reward.target, crash.service.target, max_steps=4
    )
    try:
        result = run_job(parse_config(config), sink=crash)
    finally:
        crash.restarted.wait(timeout=300)
        crash.service.stop()
    crash.check()
    assert result.state is RunState.COMPLETED and result.step == 4
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # begin + 4 steps + one re-push to the restarted service; step 3 trains on the re-pushed weights. Step 2's
    # push streams from a thread while the service is killed: it may land before the kill or fail with it.
    assert result.weight_pushes in (5, 6)
    versions = [int(r["policy_version"]) for r in records]
    assert versions[2] == versions[1] + 2 and versions[3] == versions[2] + 1


def test_sync_off_keeps_the_service_weights_and_eval_runs(tiny_models, services, train_file, tmp_path):
    """weight_sync: false (the control run that shows learning needs the push): nothing is pushed and every
    completion carries the service's own version; an eval split is scored through the same services."""
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(train_file.read_text().splitlines(keepends=True)[:2]))
    output = tmp_path / "nosync"
    config = run_config(
        tiny_models,
        train_file,
        output,
        services.reward.target,
        services.rollout.target,
        max_steps=2,
        rollout={"weight_sync": False},
    )
    config["data"]["eval"] = str(eval_file)
    config["training"]["evaluation"] = {"eval_steps": 2}
    with RolloutClient(services.rollout.target) as rollout:
        before = rollout.status().policy_version
        result = run_job(parse_config(config))
        assert rollout.status().policy_version == before
    assert result.state is RunState.COMPLETED and result.weight_pushes == 0
    records = read_metrics(result.metrics_path)
    assert [int(r["policy_version"]) for r in records] == [before, before]
    evaluations = read_metrics(result.output_dir / "eval_metrics.jsonl")
    assert [row["step"] for row in evaluations] == [0, 2]
    # The service kept its weights: greedy decoding is the same before and after.
    assert evaluations[0]["accuracy_greedy"] == evaluations[1]["accuracy_greedy"]
