"""The trainer's command-line runs: train one config in this process, or run the demo trio.

- ``python -m trainer_service train CONFIG.yaml [--resume]``: run one job in this process with a progress bar;
  reward/rollout services come from ``services.*`` or are started locally.
- ``python -m trainer_service demo [--config configs/demo.yaml]``: start reward, rollout and trainer services
  as local processes on free loopback ports, run the config through TrainerService (StartRun + WatchRun, with
  the same progress bar), then stop the services.

Serving TrainerService (``python -m trainer_service [--port 50053]``) is :mod:`trainer_service.server`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

import yaml

from grpo_runtime.call_errors import ServiceCallError
from trainer_service.client import TrainerClient
from trainer_service.config.agents import AgentsConfig
from trainer_service.config.run_config import ConfigError, RunConfig, load_config, local_reward_settings
from trainer_service.core.confinement import unix_socket_path
from trainer_service.core.output_dir import completed_resume, record_completion
from trainer_service.core.types import JobEvent, RunState, discard
from trainer_service.local.launcher import spawn_service, start_agent, start_local_services, wait_serving
from trainer_service.local.progress import ProgressSink
from trainer_service.rollout.cpu_placement import local_rollout_threads
from trainer_service.training.builders import resolve_device
from trainer_service.training.callbacks import EVAL_METRICS_FILE, read_metrics
from trainer_service.training.evaluation import greedy_accuracy_change
from trainer_service.training.job import run_job

DEMO_CONFIG = Path("configs/demo.yaml")


def _summary(state: RunState, step: int, total: int, output_dir: Path | str) -> str:
    return f"{state.value}: step {step}/{total}; outputs in {output_dir}"


def _config_error(error: ConfigError) -> int:
    """Print every problem of ``error``, one per line; the exit status of a config error."""
    for line in error.lines():
        print(f"trainer_service: config error: {line}", file=sys.stderr)
    return 2


def train(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainer_service train", description="Run one GRPO training job.")
    parser.add_argument("config", type=Path, help="training config YAML")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _config_error(exc)
    # Under `accelerate launch` / torchrun only the main process draws progress and prints the summary.
    main_process = int(os.environ.get("RANK", "0")) == 0
    finished = completed_resume(config, args.resume)
    if finished is not None:
        if main_process:
            print(finished.message)
        return 0
    try:
        with ProgressSink() if main_process else nullcontext(discard) as sink:
            result = run_job(config, sink=sink, resume=args.resume)
    except ConfigError as exc:
        return _config_error(exc)
    if main_process:
        if result.state is RunState.COMPLETED:
            record_completion(result.output_dir, result.step, result.total_steps)
        print(_summary(result.state, result.step, result.total_steps, result.output_dir))
    return 0


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
        return _config_error(exc)
    raw = yaml.safe_load(args.config.read_text())
    log_dir = config.output_dir / "services"
    print(f"starting reward and rollout services (logs in {log_dir}) ...", file=sys.stderr)
    agents = config.training.agents
    with (
        ExitStack() as stack,
        start_local_services(
            need_reward=config.services.reward is None,
            need_rollout=config.services.rollout is None,
            model=config.services.rollout_model or config.base,
            engine=config.services.rollout_engine,
            log_dir=log_dir,
            startup_timeout_s=config.services.startup_timeout_s,
            # An async run on CPU splits the cores between trainer and rollout (the trainer does its half).
            rollout_threads=local_rollout_threads(config, resolve_device(config).type),
            environment=(config.services.environment or config.services.reward or "reward")
            if config.training.tools.episode_environments
            else None,
            reward_settings=local_reward_settings(config),
            gateway=agents is not None and config.services.rollout is None,
        ) as local,
    ):
        raw.setdefault("services", {})
        raw["services"]["reward"] = config.services.reward or local.reward_target
        raw["services"]["rollout"] = config.services.rollout or local.rollout_target
        if agents is not None:
            timeout_s = config.services.startup_timeout_s
            _start_demo_agent(agents, raw["training"]["agents"], log_dir, stack, timeout_s)
        settings_file = log_dir / "trainer.yaml"
        settings_file.write_text(yaml.safe_dump(_demo_trainer_settings(config)))
        trainer = spawn_service("trainer_service", ["--config", str(settings_file)], log_dir=log_dir)
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
    eval_path = config.output_dir / EVAL_METRICS_FILE
    change = greedy_accuracy_change(read_metrics(eval_path)) if eval_path.exists() else None
    if change is not None:
        print(change)
    return 0 if final.state is RunState.COMPLETED else 1


def _start_demo_agent(
    agents: AgentsConfig,
    raw: dict[str, Any],
    log_dir: Path,
    stack: ExitStack,
    startup_timeout_s: float,
) -> None:
    """Start ``agents.command`` (stopped when ``stack`` closes) and point the run's raw ``training.agents``
    at it: a trainer service runs no command a caller names."""
    if agents.command is None:
        return
    print(f"starting the agent: {' '.join(agents.command)}", file=sys.stderr)
    agent = start_agent(agents.command, log_dir=log_dir, startup_timeout_s=startup_timeout_s)
    stack.callback(agent.stop)
    raw.pop("command")
    raw["target"] = agent.target


def _demo_trainer_settings(config: RunConfig) -> dict[str, Any]:
    """Settings of the demo's own trainer service: its StartRun confinement roots are the directories of this
    config's output, data, model, secret and socket files, and its allow-lists hold this config's tools and
    reporting integrations (the user runs the demo on their own files and code)."""

    def parents(*paths: str | None) -> list[str]:
        return list(dict.fromkeys(str(Path(path).resolve().parent) for path in paths if path is not None))

    t, s = config.training, config.services
    baseline = t.guards.eval_gate.baseline_file if t.guards and t.guards.eval_gate else None
    models = [path for path in (config.base, s.rollout_model) if path is not None and Path(path).exists()]
    addresses = [s.reward, s.environment, *(s.rollout or [])]
    sockets = [unix_socket_path(target) for target in addresses if target is not None]
    return {
        "runs_root": str(Path(config.output).resolve()),
        "data_roots": parents(config.data.train, config.data.eval, baseline),
        "model_roots": parents(*models),
        "secret_roots": parents(s.admin_token_file, s.tls_ca_file),
        "socket_roots": parents(*sockets),
        "allowed_tools": list(t.tools.functions or []),
        "allowed_report_to": [t.report_to] if isinstance(t.report_to, str) else list(t.report_to),
    }


def _drive(target: str, config_yaml: str) -> JobEvent:
    """StartRun, then draw WatchRun's events until the run ends; returns the final event."""
    with TrainerClient(target, timeout_s=None) as trainer:
        run_id = trainer.start_run(config_yaml)
        final = JobEvent(step=0, total_steps=0, state=RunState.PENDING)
        try:
            with ProgressSink() as sink:
                for final in trainer.watch_run(run_id):
                    sink(final)
        except KeyboardInterrupt:
            trainer.stop_run(run_id)
            raise
        except ServiceCallError as error:
            print(f"trainer_service: watch failed: {error.code.name} {error.details}", file=sys.stderr)
        return final
