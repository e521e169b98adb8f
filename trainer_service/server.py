"""Service assembly: settings → RunManager → servicer binding, and ``serve`` (the ``python -m`` entry)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.cli import run_service
from grpo_runtime.server import Cleanup, ServiceBinding
from trainer_service.api.trainer import TrainerServicer
from trainer_service.core.runs import RunManager
from trainer_service.settings import DEFAULT_PORT, TrainerServiceSettings, load_settings


async def build(settings: TrainerServiceSettings) -> tuple[list[ServiceBinding], Cleanup]:
    """The TrainerService binding and the cleanup that stops live runs (inside the server's event loop)."""
    runs = RunManager(settings)
    binding = ServiceBinding(
        servicer=TrainerServicer(runs),
        add_to_server=trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        descriptor=trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
    )

    async def cleanup() -> None:
        await runs.close(grace_s=settings.stop_grace_s)

    return [binding], cleanup


async def _build(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[list[ServiceBinding], Cleanup]:
    return await build(load_settings(settings))


def serve(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer_service [--port 50053] [--host H] [--config FILE]``: serve TrainerService."""
    return run_service(
        prog="trainer_service",
        description="GRPO trainer service: runs trl.GRPOTrainer jobs against reward and rollout services.",
        default_port=DEFAULT_PORT,
        build=_build,
        argv=argv,
    )
