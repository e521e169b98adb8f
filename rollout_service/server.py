"""Service assembly: settings → engine → RolloutCore → servicer binding, and the CLI entry point.

``python -m rollout_service --port P --model DIR [--engine hf|vllm] [--openai-port PORT] [--config FILE]``;
the model directory is checked before anything starts (a missing or non-causal-LM model exits with code 2
and a one-line reason).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.cli import run_service
from grpo_runtime.compute_thread import ComputeThread
from grpo_runtime.env_client import EnvironmentClient
from grpo_runtime.server import ServiceBinding
from rollout_service.api.rollout import RolloutServicer
from rollout_service.core.rollout import RolloutCore
from rollout_service.core.weight_channel import WeightChannel
from rollout_service.engines.registry import build_engine, check_model_dir
from rollout_service.gateway.http_app import GatewayEndpoint
from rollout_service.gateway.metrics import SessionMetrics
from rollout_service.gateway.service import AgentGateway
from rollout_service.settings import RolloutSettings
from rollout_service.weight_plane.shared_memory import SharedMemoryDir
from rollout_service.weights import ParamCatalog

DEFAULT_PORT = 50052


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rollout")
    group.add_argument("--model", default=None, metavar="DIR", help="model directory (config.json + weights)")
    group.add_argument(
        "--engine",
        default=None,
        choices=["auto", "hf", "vllm"],
        help="generation engine (default auto: vllm when it can run, else hf)",
    )
    group.add_argument("--device", default=None, help="cpu, cuda:0, ... (default auto)")
    group.add_argument(
        "--weight-shm-dir",
        default=None,
        metavar="DIR",
        help="memory-backed directory shared with the trainer for weight pushes (default off)",
    )
    group.add_argument(
        "--openai-port",
        type=int,
        default=None,
        metavar="PORT",
        help="HTTP port of the OpenAI-compatible gateway (gateway.port; default off)",
    )


def settings_from(args: argparse.Namespace, settings: dict[str, Any]) -> RolloutSettings:
    """Config-file settings with the command-line flags applied over them."""
    merged = RolloutSettings.model_validate(settings)
    overrides = {
        k: v
        for k, v in (
            ("model", args.model),
            ("engine", args.engine),
            ("device", args.device),
            ("weight_shm_dir", getattr(args, "weight_shm_dir", None)),
        )
        if v
    }
    openai_port = getattr(args, "openai_port", None)
    if openai_port is not None:
        overrides["gateway"] = merged.gateway.model_copy(update={"port": openai_port})
    return merged.model_copy(update=overrides)


async def build_core(settings: RolloutSettings) -> RolloutCore:
    """Load the engine on the core's compute thread (it takes seconds; the thread's OpenMP pool is the one
    generation uses) and wrap it in a started RolloutCore."""
    check_model_dir(settings.model)
    model_dir = settings.model
    assert model_dir is not None  # check_model_dir refuses a missing one
    compute = ComputeThread("rollout-engine")
    try:
        engine = await compute.run(build_engine, settings.model, settings)
    except BaseException:
        await asyncio.to_thread(compute.close)
        raise
    catalog = await asyncio.to_thread(ParamCatalog.from_model_dir, model_dir)
    core = RolloutCore(
        engine,
        engine.tokenizer,
        catalog,
        max_prompts=settings.max_prompts,
        max_request_sequences=settings.max_request_sequences,
        max_request_tokens=settings.max_request_tokens,
        max_concurrent_generates=settings.max_concurrent_generates,
        weights_root=settings.weights_root,
        max_weight_bytes=settings.max_weight_bytes,
        batch_window_s=settings.batch_window_ms / 1000,
        batch_gather_s=settings.batch_gather_ms / 1000,
        max_batch_rows=settings.max_batch_size,
        partial_segment_tokens=settings.partial_segment_tokens,
        version_wait_s=settings.version_wait_s,
        image_limits=settings.images,
        environments=environment_clients(settings),
        episode_settings=settings.episodes,
        weight_channel=WeightChannel(
            SharedMemoryDir.open(settings.weight_shm_dir) if settings.weight_shm_dir else None,
            engine.device,
        ),
        compute=compute,
    )
    await core.start()
    return core


def environment_clients(settings: RolloutSettings) -> dict[str, EnvironmentClient]:
    """One client per configured environment target; the episode loop bounds each call itself."""
    return {
        name: EnvironmentClient(address, timeout_s=None)
        for name, address in settings.episodes.targets.items()
    }


def build_gateway(core: RolloutCore, settings: RolloutSettings) -> AgentGateway:
    """The gateway's sessions and endpoints over the core (served on HTTP when ``gateway.port`` is set)."""
    name = settings.gateway.served_model_name or Path(str(settings.model)).name
    return AgentGateway(core, settings.gateway, name)


def binding(core: RolloutCore, gateway: AgentGateway | None = None) -> ServiceBinding:
    """The servicer, and the gateway's HTTP endpoint beside it when the gateway has a port."""
    endpoint = (
        GatewayEndpoint(gateway, gateway.settings)
        if gateway is not None and gateway.settings.port is not None
        else None
    )
    return ServiceBinding(
        servicer=RolloutServicer(core, gateway),
        add_to_server=rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        descriptor=rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
        companions=(endpoint,) if endpoint is not None else (),
        collectors=(
            *((endpoint.metrics,) if endpoint is not None else ()),
            SessionMetrics(core.engine, gateway.sessions if gateway is not None else None),
        ),
    )


async def build(args: argparse.Namespace, settings: dict[str, Any]):
    resolved = settings_from(args, settings)
    core = await build_core(resolved)
    return [binding(core, build_gateway(core, resolved))], core.close


def main(argv: list[str] | None = None) -> int:
    return run_service(
        prog="rollout_service",
        description="GRPO rollout service: generation with exact logprobs, weight updates, sleep/wake.",
        default_port=DEFAULT_PORT,
        add_arguments=add_arguments,
        build=build,
        argv=argv,
    )
