"""StartRun never makes anything import a module its caller names, through a real TrainerService on loopback:
a ``training.tools.functions`` entry the operator did not allow-list is INVALID_ARGUMENT naming the entry
before any worker starts, and the module (whose top-level code writes a marker file) is never imported; an
allow-listed one is accepted. A ``base`` outside the model roots, a reporting integration, an inline DeepSpeed
config and a unix socket outside the socket roots are refused the same way."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from tests.integration.trainer.fixtures import confined_settings
from trainer_service.server import build

MARKER_SUFFIX = ".imported"


@pytest.fixture
def tool_module(tmp_path, monkeypatch) -> str:
    """The name of a fresh module whose import writes ``<module>.imported`` beside it; importable by this
    process and by any process it starts (sys.path and PYTHONPATH), as a run's reward service would be."""
    name = f"start_run_tool_{uuid.uuid4().hex}"
    source = tmp_path / "modules" / f"{name}.py"
    source.parent.mkdir()
    source.write_text(
        "from pathlib import Path\n"
        f"Path(__file__).with_suffix({MARKER_SUFFIX!r}).write_text('imported')\n\n\n"
        "def double(x: int) -> int:\n"
        '    """Doubles x.\n\n    Args:\n        x: A number.\n    """\n'
        "    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(source.parent))
    monkeypatch.setenv("PYTHONPATH", str(source.parent))
    return name


def imported(tmp_path: Path, module: str) -> bool:
    """Whether ``module`` was imported here or by any process that could import it."""
    return module in sys.modules or (tmp_path / "modules" / f"{module}{MARKER_SUFFIX}").exists()


@asynccontextmanager
async def serve(settings) -> AsyncIterator[tuple]:
    """(stub, health stub) of a TrainerService with ``settings``; its runs are stopped on exit."""
    bindings, cleanup = await build(settings)
    async with GrpcServer(ServerConfig(port=0), bindings) as server:
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield trainer_pb2_grpc.TrainerServiceStub(channel), health_pb2_grpc.HealthStub(channel)
        await cleanup()


@pytest.fixture
async def trainer(tmp_path):
    """A TrainerService confined to tmp_path that allow-lists no function tool."""
    async with serve(confined_settings(tmp_path)) as stubs:
        yield stubs


def config_yaml(tmp_path: Path, training: dict | None = None, **overrides) -> str:
    """A config inside tmp_path's roots; no services (a run would start its own reward service, with the
    run's tools in its settings) unless overridden."""
    config = {
        "base": "m",
        "output": str(tmp_path / "runs"),
        "experiment_name": "exp",
        "data": {"train": str(tmp_path / "missing.jsonl")},
        "training": training or {},
        **overrides,
    }
    return yaml.safe_dump(config)


async def start_error(stub, text: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=text))
    return error.value


async def test_a_tool_not_allow_listed_is_refused_naming_the_entry_and_never_imported(
    trainer, tmp_path, tool_module
):
    stub, health = trainer
    tools = {"tools": {"functions": [f"{tool_module}:double"], "max_tool_calling_iterations": 1}}
    error = await start_error(stub, config_yaml(tmp_path, tools))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("config_yaml: training.tools.functions[0]: "), error.details()
    assert f"{tool_module}:double" in error.details() and "allowed_tools" in error.details()
    assert not (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs  # no worker was started
    assert not imported(tmp_path, tool_module)
    status = await health.Check(health_pb2.HealthCheckRequest())
    assert status.status == health_pb2.HealthCheckResponse.SERVING


async def test_an_allow_listed_tool_is_accepted_and_only_listed_entries_are(tmp_path, tool_module):
    allowed = f"{tool_module}:double"
    async with serve(confined_settings(tmp_path, allowed_tools=[allowed])) as (stub, _):
        closed = {"reward": "127.0.0.1:1", "rollout": "127.0.0.1:1"}
        other = "tests.support.tool_functions:multiply"
        error = await start_error(
            stub, config_yaml(tmp_path, {"tools": {"functions": [allowed, other]}}, services=closed)
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("config_yaml: training.tools.functions[1]: "), error.details()

        # Its services are closed ports, so its worker imports nothing (a reward service the run did not
        # start must already serve the functions) and fails, or is stopped when the service closes.
        reply = await stub.StartRun(
            trainer_pb2.StartRunRequest(
                config_yaml=config_yaml(tmp_path, {"tools": {"functions": [allowed]}}, services=closed)
            )
        )
        listed = (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs
        assert [run.run_id for run in listed] == [reply.run_id]
    assert tool_module not in sys.modules  # the service itself never imports a run's tools


async def test_paths_and_names_a_run_config_may_not_reach_are_refused_naming_the_key(trainer, tmp_path):
    stub, _ = trainer
    outside_model = tmp_path / "models" / "policy"  # tmp_path's models are outside the model roots
    outside_model.mkdir(parents=True)
    inline_deepspeed = {"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/etc"}}}
    cases = [
        ("base", {"base": str(outside_model)}),
        ("base", {"base": "/etc"}),
        ("base", {"base": "../../model"}),
        ("services.rollout_model", {"services": {"rollout_model": "/usr"}}),
        ("services.rollout[0]", {"services": {"rollout": "unix:/run/docker.sock"}}),
        ("training.report_to", {"training": {"report_to": "wandb"}}),
        ("training.model.deepspeed", {"training": {"model": {"deepspeed": inline_deepspeed}}}),
    ]
    for key, overrides in cases:
        error = await start_error(stub, config_yaml(tmp_path, **overrides))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (overrides, error.details())
        assert error.details().startswith(f"config_yaml: {key}: "), error.details()
    assert not (await stub.ListRuns(trainer_pb2.ListRunsRequest())).runs
