"""Command line of the trainer: serve, train one config, or run the demo trio.

- ``python -m trainer_service [--port 50053] [--host H] [--config FILE]``: serve TrainerService.
- ``python -m trainer_service train CONFIG.yaml [--resume]``: run one job in this process with a progress bar;
  reward/rollout services come from ``services.*`` or are started locally.
- ``python -m trainer_service demo [--config configs/demo.yaml]``: start reward, rollout and trainer services
  as local processes on free loopback ports, run the config through TrainerService (StartRun + WatchRun, with
  the same progress bar), then stop the services.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from pydantic import BaseModel, ConfigDict, Field

from grpo_runtime.cli import run_service
from grpo_runtime.client import create_sync_channel
from grpo_runtime.server import Cleanup, ServiceBinding
from trainer_service.config import ConfigError, load_config
from trainer_service.events import JobEvent, RunState, discard
from trainer_service.job import overlapping_on_cpu
from trainer_service.launcher import overlap_threads, spawn_service, start_local_services, wait_serving
from trainer_service.progress import ProgressSink

DEFAULT_PORT = 50053
DEMO_CONFIG = Path("configs/demo.yaml")


class TrainerServiceSettings(BaseModel):
    """Service settings (the ``--config`` YAML without its ``server:`` block)."""

    model_config = ConfigDict(extra="forbid")

    # On shutdown, seconds live runs get to reach a step boundary and checkpoint before being terminated.
    stop_grace_s: float = Field(default=60.0, ge=0)


async def _build(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[list[ServiceBinding], Cleanup]:
    # Imported here so `train`/`demo` start without the service layer; runs.py pulls in the worker + torch.
    from trainer_service.api.servicer import TrainerServicer
    from trainer_service.runs import RunManager

    service_settings = TrainerServiceSettings.model_validate(settings)
    runs = RunManager()
    binding = ServiceBinding(
        servicer=TrainerServicer(runs),
        add_to_server=trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        descriptor=trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
    )

    async def cleanup() -> None:
        await runs.close(grace_s=service_settings.stop_grace_s)

    return [binding], cleanup


def serve(argv: Sequence[str] | None) -> int:
    return run_service(
        prog="trainer_service",
        description="GRPO trainer service: runs trl.GRPOTrainer jobs against reward and rollout services.",
        default_port=DEFAULT_PORT,
        build=_build,
        argv=argv,
    )


def _summary(state: RunState, step: int, total: int, output_dir: Path | str) -> str:
    return f"{state.value}: step {step}/{total}; outputs in {output_dir}"


def train(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainer_service train", description="Run one GRPO training job.")
    parser.add_argument("config", type=Path, help="training config YAML")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    args = parser.parse_args(argv)
    # The job module pulls in torch/TRL; parse and report config errors before paying for that.
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"trainer_service: config error: {exc}", file=sys.stderr)
        return 2
    from trainer_service.job import run_job  # heavy: torch, transformers, TRL

    # Under `accelerate launch` / torchrun only the main process draws progress and prints the summary.
    main_process = int(os.environ.get("RANK", "0")) == 0
    try:
        with ProgressSink() if main_process else nullcontext(discard) as sink:
            result = run_job(config, sink=sink, resume=args.resume)
    except ConfigError as exc:
        print(f"trainer_service: config error: {exc}", file=sys.stderr)
        return 2
    if main_process:
        print(_summary(result.state, result.step, result.total_steps, result.output_dir))
    return 0


def _event(message: trainer_pb2.RunEvent) -> JobEvent:
    states = {value: name for name, value in trainer_pb2.RunState.items()}
    name = states[message.state].removeprefix("RUN_STATE_").lower()
    return JobEvent(
        step=message.step,
        total_steps=message.total_steps,
        state=RunState(name),
        metrics=dict(message.metrics),
        message=message.message,
    )


def demo(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="trainer_service demo", description="Start the reward/rollout/trainer trio locally and train."
    )
    parser.add_argument(
        "--config", type=Path, default=DEMO_CONFIG, help=f"training config (default {DEMO_CONFIG})"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"trainer_service: config error: {exc}", file=sys.stderr)
        return 2
    raw = yaml.safe_load(args.config.read_text())
    log_dir = config.output_dir / "services"
    print(f"starting reward and rollout services (logs in {log_dir}) ...", file=sys.stderr)
    with start_local_services(
        need_reward=config.services.reward is None,
        need_rollout=config.services.rollout is None,
        model=config.services.rollout_model or config.base,
        engine=config.services.rollout_engine,
        log_dir=log_dir,
        startup_timeout_s=config.services.startup_timeout_s,
        # An async run on CPU splits the cores between trainer and rollout (the trainer does its half).
        rollout_threads=overlap_threads()[1] if overlapping_on_cpu(config) else None,
    ) as local:
        raw.setdefault("services", {})
        raw["services"]["reward"] = config.services.reward or local.reward.target
        raw["services"]["rollout"] = config.services.rollout or local.rollout.target
        trainer = spawn_service("trainer_service", log_dir=log_dir)
        try:
            wait_serving(
                trainer.target, trainer.process, config.services.startup_timeout_s, "trainer_service"
            )
            print(
                f"services: reward {raw['services']['reward']}, rollout {raw['services']['rollout']}, "
                f"trainer {trainer.target}",
                file=sys.stderr,
            )
            final = _drive(trainer.target, yaml.safe_dump(raw))
        finally:
            trainer.stop()
    print(_summary(final.state, final.step, final.total_steps, config.output_dir))
    if final.message:
        print(final.message)
    return 0 if final.state is RunState.COMPLETED else 1


def _drive(target: str, config_yaml: str) -> JobEvent:
    """StartRun, then draw WatchRun's events until the run ends; returns the final event."""
    with create_sync_channel(target) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        run_id = stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml)).run_id
        final = JobEvent(step=0, total_steps=0, state=RunState.PENDING)
        try:
            with ProgressSink() as sink:
                for message in stub.WatchRun(trainer_pb2.WatchRunRequest(run_id=run_id)):
                    final = _event(message)
                    sink(final)
        except KeyboardInterrupt:
            stub.StopRun(trainer_pb2.StopRunRequest(run_id=run_id))
            raise
        except grpc.RpcError as error:
            print(f"trainer_service: watch failed: {error.code().name} {error.details()}", file=sys.stderr)
        return final


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "train":
        return train(args[1:])
    if args and args[0] == "demo":
        return demo(args[1:])
    return serve(args)
