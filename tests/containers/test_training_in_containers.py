"""A GRPO run from the trainer container through the rollout and reward containers, with the reward model
swapped through LoadModel and the rollout container killed and restarted while the run goes on."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from testcontainers.core.network import Network

from tests.containers.service_containers import (
    CONTAINER_UID,
    Running,
    launch_service,
    wait_all_serving,
    wait_serving,
)

RUNS_IN_CONTAINER = "/var/lib/grpo/runs"
MODELS_IN_CONTAINER = "/models"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs")
    path.chmod(0o777)  # written by the containers' non-root user
    return path


@pytest.fixture(scope="module")
def trio(images, network: Network, runs_dir: Path, tiny_models) -> Iterator[dict[str, Running]]:
    models = str(Path(tiny_models["prm-token"]).parent)
    started: dict[str, Running] = {}
    try:
        started["reward"] = launch_service(
            images["reward"], "reward", network, [], volumes=[(models, MODELS_IN_CONTAINER, "ro")]
        )
        started["rollout"] = launch_service(
            images["rollout"], "rollout", network, ["--model", "/opt/grpo/models/demo", "--engine", "hf"]
        )
        # StartRun writes only under runs_root, reads data only under data_roots and models only under
        # model_roots, as deployments set them.
        config = runs_dir.parent / "trainer.yaml"
        roots = {
            "runs_root": RUNS_IN_CONTAINER,
            "data_roots": ["/opt/grpo/data"],
            "model_roots": ["/opt/grpo/models"],
        }
        config.write_text(yaml.safe_dump(roots))
        config.chmod(0o644)
        started["trainer"] = launch_service(
            images["trainer"],
            "trainer",
            network,
            ["--config", "/etc/grpo/trainer.yaml"],
            volumes=[(str(runs_dir), RUNS_IN_CONTAINER, "rw"), (str(config), "/etc/grpo/trainer.yaml", "ro")],
        )
        wait_all_serving(started.values())
        yield started
    finally:
        for running in started.values():
            running.remove()


def run_config(name: str, reward_fn: str, max_steps: int = 6) -> str:
    return yaml.safe_dump(
        {
            "base": "/opt/grpo/models/demo",
            "output": f"{RUNS_IN_CONTAINER}/{name}",
            "data": {"train": "/opt/grpo/data/demo/train.jsonl"},
            "training": {
                "max_steps": max_steps,
                "save_steps": 3,
                "seed": 0,
                "optimizer": {"per_device_train_batch_size": 16, "learning_rate": 1e-3},
                "generation": {"num_generations": 4, "max_completion_length": 8},
                "rewards": {"reward_fn": reward_fn, "params": {"accuracy": {"mode": "numeric"}}},
                "model": {"lora": {"r": 8, "alpha": 16}},
            },
            "services": {"reward": "reward:50051", "rollout": "rollout:50052", "retry_timeout_s": 240},
        }
    )


def watch_run(trainer: Running, config_yaml: str, on_step: Callable[[int], None]) -> list:
    """StartRun, then follow WatchRun to the end, calling ``on_step`` once per new step."""
    with grpc.insecure_channel(trainer.address) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        run_id = stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml), timeout=120).run_id
        events, seen = [], set()
        for event in stub.WatchRun(trainer_pb2.WatchRunRequest(run_id=run_id), timeout=900):
            events.append(event)
            if event.step and event.step not in seen:
                seen.add(event.step)
                on_step(event.step)
    return events


def load_judge(reward: Running, model: str) -> reward_pb2.ModelInfo:
    with grpc.insecure_channel(reward.address) as channel:
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        request = reward_pb2.LoadModelRequest(
            name="judge", path=f"{MODELS_IN_CONTAINER}/{model}", kind=reward_pb2.MODEL_KIND_PRM
        )
        return admin.LoadModel(request, timeout=120).model


def metrics_steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_grpo_run_completes_while_the_reward_model_is_swapped(trio, runs_dir):
    assert load_judge(trio["reward"], "prm-token").version == 1
    swapped: list[reward_pb2.ModelInfo] = []

    def swap_once(step: int) -> None:
        if step == 2 and not swapped:
            swapped.append(load_judge(trio["reward"], "prm-steptag"))

    events = watch_run(trio["trainer"], run_config("swap", "accuracy:1.0,prm:judge:0.2"), swap_once)
    assert events[-1].state == trainer_pb2.RUN_STATE_COMPLETED, events[-1].message
    assert swapped and swapped[0].version == 2 and swapped[0].path.endswith("prm-steptag")

    output = runs_dir / "swap"
    assert metrics_steps(output / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert (output / "adapter_model.safetensors").is_file()
    assert (output / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (output / "checkpoint-3").is_dir() and (output / "checkpoint-6").is_dir()
    assert (output / "metrics.jsonl").stat().st_uid == int(CONTAINER_UID)  # written by the non-root user


def test_rollout_container_killed_and_restarted_mid_run(trio, runs_dir):
    rollout = trio["rollout"].container
    restarted = threading.Event()

    def kill_and_restart(step: int) -> None:
        if step == 2 and not restarted.is_set():
            rollout.kill()
            rollout.start()
            restarted.set()

    events = watch_run(trio["trainer"], run_config("restart", "accuracy"), kill_and_restart)
    assert restarted.is_set()
    assert events[-1].state == trainer_pb2.RUN_STATE_COMPLETED, events[-1].message
    assert metrics_steps(runs_dir / "restart" / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    wait_serving(trio["rollout"])
