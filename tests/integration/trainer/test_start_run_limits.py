"""StartRun as a hostile caller sees it, through a real TrainerService on loopback: run configs that break the
run confinement, hostile YAML and non-finite numbers are INVALID_ARGUMENT naming the key, a run id that is
not a name is refused, the concurrent-run cap is RESOURCE_EXHAUSTED, an output directory a live worker of
another process holds is FAILED_PRECONDITION. All of it is decided before a worker starts, so these are fast.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from tests.integration.trainer.fixtures import confined_settings
from tests.support.hostile_inputs import alias_bomb, output_lock_holder
from trainer_service.server import build


@pytest.fixture
async def trainer(tmp_path):
    """(stub, health stub) of a TrainerService confined to tmp_path, at most one live run."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text("t0ken\n")
    bindings, cleanup = await build(confined_settings(tmp_path, max_concurrent_runs=1))
    async with GrpcServer(ServerConfig(port=0), bindings) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield trainer_pb2_grpc.TrainerServiceStub(channel), health_pb2_grpc.HealthStub(channel)
        await cleanup()


def config_yaml(tmp_path: Path, **overrides) -> str:
    """A valid config inside tmp_path's roots whose services are closed loopback ports."""
    config = {
        "base": "m",
        "output": str(tmp_path / "runs"),
        "experiment_name": "exp",
        "data": {"train": str(tmp_path / "missing.jsonl")},
        "services": {"reward": "127.0.0.1:1", "rollout": "127.0.0.1:1"},
    }
    config.update(overrides)
    return yaml.safe_dump(config)


async def start_error(stub, text: str, **request) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=text, **request))
    return error.value


async def test_paths_outside_the_roots_are_invalid_argument(trainer, tmp_path):
    stub, health = trainer
    escape = f"/tmp/escape-{uuid.uuid4().hex}"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "link").symlink_to("/tmp")
    closed = {"reward": "127.0.0.1:1", "rollout": "127.0.0.1:1"}
    cases = [
        ("output", {"output": escape}),
        ("output", {"output": "/dev", "experiment_name": "null"}),
        ("output", {"experiment_name": "link"}),  # a symlink inside the root to /tmp
        ("experiment_name", {"experiment_name": "../../escape"}),
        ("experiment_name", {"experiment_name": escape}),
        ("data.train", {"data": {"train": "/etc/passwd"}}),
        ("data.train", {"data": {"train": "/dev/zero"}}),
        ("services.admin_token_file", {"services": {**closed, "admin_token_file": "/etc/hostname"}}),
    ]
    for key, overrides in cases:
        error = await start_error(stub, config_yaml(tmp_path, **overrides))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (overrides, error.details())
        assert error.details().startswith(f"config_yaml: {key}: "), error.details()
    assert not Path(escape).exists()
    assert not (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs
    status = await health.Check(health_pb2.HealthCheckRequest())
    assert status.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (alias_bomb(), "alias bomb"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper"),
        ("x: '" + "a" * (300 << 10) + "'\n", "bytes"),  # a run config is a few KiB: 256 KiB at most
        ("base: [unclosed\n", "invalid YAML"),
        ("- a list\n", "mapping"),
    ],
)
async def test_hostile_yaml_is_invalid_argument_naming_config_yaml(trainer, text, fragment):
    stub, _ = trainer
    error = await start_error(stub, text)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("config_yaml: ") and fragment in error.details(), error.details()


@pytest.mark.parametrize(
    ("training", "key"),
    [
        ({"optimizer": {"learning_rate": float("nan")}}, "training.optimizer.learning_rate"),
        ({"generation": {"temperature": float("inf")}}, "training.generation.temperature"),
    ],
)
async def test_non_finite_numbers_are_invalid_argument(trainer, tmp_path, training, key):
    stub, _ = trainer
    error = await start_error(stub, config_yaml(tmp_path, training=training))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"config_yaml: {key}: "), error.details()


async def test_run_ids_must_be_names(trainer, tmp_path):
    stub, _ = trainer
    for run_id in ("../x", "a" * 65, "a b", "x\x00"):
        error = await start_error(stub, config_yaml(tmp_path), run_id=run_id)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("run_id: ")


@pytest.mark.slow  # waits for a real worker to start and fail (tens of seconds on a loaded machine)
async def test_concurrent_runs_are_capped(trainer, tmp_path):
    stub, _ = trainer
    first = await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml(tmp_path), run_id="one"))
    assert first.run_id == "one"
    # The first run is live (its worker is still importing torch) and takes the only slot.
    error = await start_error(stub, config_yaml(tmp_path, experiment_name="other"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details().startswith("max_concurrent_runs: "), error.details()
    # Once it has ended (its data file does not exist) the slot is free again.
    async for _ in stub.WatchRun(trainer_pb2.WatchRunRequest(run_id="one")):
        pass
    info = (await stub.GetRun(trainer_pb2.GetRunRequest(run_id="one"))).run
    assert info.state == trainer_pb2.RUN_STATE_FAILED and "missing.jsonl" in info.message


async def test_an_output_held_by_a_live_worker_elsewhere_is_refused(trainer, tmp_path):
    """A worker left by another service process still writes the directory: no run or resume may share it."""
    stub, _ = trainer
    output = tmp_path / "runs" / "exp"
    output.mkdir(parents=True)
    with output_lock_holder(output) as pid:
        for resume in (False, True):
            error = await start_error(stub, config_yaml(tmp_path), resume=resume)
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error.details().startswith("config_yaml: output: ") and str(pid) in error.details()
    assert not (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs


async def test_every_config_error_is_listed_up_to_a_bound(trainer, tmp_path):
    stub, _ = trainer
    error = await start_error(stub, config_yaml(tmp_path, training={"lr": 1e-3, "num_generation": 4}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "config_yaml: training.lr: moved to training.optimizer.learning_rate; "
        "training.num_generation: unknown key; did you mean training.generation.num_generations?"
    )
    unknown = {f"key{index}": 1 for index in range(25)}
    error = await start_error(stub, config_yaml(tmp_path, training=unknown))
    assert error.details().count("unknown key") == 20 and error.details().endswith("; and 5 more")
