"""One GRPO training job: model, data, rewards, rollout and weight sync wired into ``trl.GRPOTrainer``.

``run_job(config)`` is the whole run, used by the CLI (in-process) and by the service (in a worker process):

1. reward and rollout services: the configured addresses, or local ones started by
   :mod:`trainer_service.local.launcher`;
2. the job's parts, each from a named builder in :mod:`trainer_service.training.assembly`: data (train/eval
   splits converted to GRPO rows, reward metadata checked before any generation), objective (GRPOConfig,
   model, one TRL reward function per ``reward_fn`` term, all scored by one reward-service call per batch),
   rollout (replicas, weight sync, ``rollout_func``), callbacks (weight sync, metrics.jsonl/events,
   evaluation, guards, stop requests), and the loss-variant ``GRPOTrainer`` built from them;
3. training, then the outputs in ``output/experiment_name``: ``metrics.jsonl``, ``checkpoint-N/`` every
   ``save_steps`` (adapter, optimizer, scheduler, RNG, data position, policy version), the final adapter and
   tokenizer, and ``reward_curve.png``.

What the job derives from the config (device and precision, reward terms, admin token) is computed once, in
:class:`~trainer_service.training.job_settings.JobSettings`, and passed down.

Multi-GPU: run ``accelerate launch --config_file ACC.yaml -m trainer_service train CONFIG.yaml`` with
``training.model.deepspeed`` or ``training.model.fsdp_config`` set and ``services.*`` pointing at running
services; see docs/trainer.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, set_seed
from trl import GRPOTrainer

from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.client import ChannelConfig
from reward_service.client import RewardClient
from rollout_service.client import RolloutClient
from trainer_service.config.reward_terms import RewardTerm
from trainer_service.config.run_config import ConfigError, RunConfig, local_reward_settings
from trainer_service.core.types import EventSink, JobEvent, RunState, discard
from trainer_service.local.launcher import LocalServices, start_agent, start_local_services
from trainer_service.rollout.cpu_placement import local_rollout_threads, trainer_cpu_threads
from trainer_service.rollout.function_tools import check_served_tools
from trainer_service.rollout.weight_sync import WeightSync
from trainer_service.training.assembly import (
    Callbacks,
    build_callbacks,
    build_data,
    build_objective,
    build_rollout,
    build_trainer,
    open_reward_client,
)
from trainer_service.training.batch_sizing import resolve_batch_size
from trainer_service.training.builders import Device
from trainer_service.training.callbacks import EVAL_METRICS_FILE, METRICS_FILE, StopFlag, plot_reward_curve
from trainer_service.training.checkpoints import is_complete, last_complete_checkpoint
from trainer_service.training.data import REWARD_METADATA, read_split
from trainer_service.training.importance_sampling import ImportanceSamplingPlan, resolve_importance_sampling
from trainer_service.training.job_settings import Endpoints, JobSettings

REWARD_CURVE_FILE = "reward_curve.png"


@dataclass(frozen=True)
class JobResult:
    """How a job ended and where its outputs are."""

    state: RunState
    step: int
    total_steps: int
    output_dir: Path
    metrics_path: Path
    reward_curve: Path | None
    policy_version: int | None
    weight_pushes: int
    push_seconds: float


def rollout_engine(channel: ChannelConfig) -> str | None:
    """The engine the rollout service at ``channel`` reports ("hf", "vllm"), or None when it does not answer
    now (the importance-sampling plan then keeps the correction on)."""
    try:
        with RolloutClient(channel) as client:
            return client.status(timeout_s=10.0).engine or None
    except ServiceCallError:
        return None


def importance_sampling_plan(
    config: RunConfig, device: Device, rollout: ChannelConfig
) -> ImportanceSamplingPlan:
    """``training.loss.importance_sampling`` resolved for this run (:mod:`~.importance_sampling`)."""
    t = config.training
    return resolve_importance_sampling(
        t.loss.importance_sampling,
        async_rollout=t.rollout.async_rollout,
        weight_sync=t.rollout.weight_sync,
        rollout_engine=rollout_engine(rollout) if t.loss.importance_sampling == "auto" else None,
        trainer_fp32=device.fp32 and t.model.quantization == "none",
    )


def channel_configs(
    config: RunConfig, settings: JobSettings, reward_target: str, rollout_targets: list[str]
) -> Endpoints:
    s = config.services
    common: dict[str, Any] = {"admin_token": settings.admin_token, "tls_ca_file": s.tls_ca_file}
    return Endpoints(
        reward=ChannelConfig(target=reward_target, default_timeout_s=s.request_timeout_s, **common),
        rollout=ChannelConfig(target=rollout_targets[0], default_timeout_s=s.request_timeout_s, **common),
        rollout_targets=tuple(rollout_targets),
    )


def resolve_services(
    config: RunConfig, settings: JobSettings, stack: ExitStack, sink: EventSink
) -> tuple[RunConfig, Endpoints]:
    """Configured service addresses, or local services started for this job (stopped when ``stack``
    closes); and the config with the address of an agent started for ``training.agents.command``.
    """
    s = config.services
    if config.training.tools.functions and (s.environment or s.reward) is not None:
        # A service this run did not start must already offer the functions (it loads no caller's code).
        target = ChannelConfig(
            target=s.environment or s.reward, admin_token=settings.admin_token, tls_ca_file=s.tls_ca_file
        )
        check_served_tools(config.training.tools.functions, target, s.request_timeout_s)
    endpoints = _service_endpoints(config, settings, stack, sink)
    return _with_local_agent(config, stack, sink), endpoints


def _service_endpoints(
    config: RunConfig, settings: JobSettings, stack: ExitStack, sink: EventSink
) -> Endpoints:
    """The configured reward and rollout endpoints, or those of services started here (a rollout service
    with its gateway for an agent run)."""
    s = config.services
    if s.reward is not None and s.rollout is not None:
        return channel_configs(config, settings, s.reward, s.rollout)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "must be set for multi-process runs (every rank would start its own services)",
            key="services.rollout",
        )
    sink(JobEvent(step=0, total_steps=0, state=RunState.PENDING, message="starting local services"))
    token = settings.admin_token
    local: LocalServices = start_local_services(
        need_reward=s.reward is None,
        need_rollout=s.rollout is None,
        model=s.rollout_model or config.base,
        engine=s.rollout_engine,
        log_dir=config.output_dir / "services",
        env={"GRPO_ADMIN_TOKEN": token} if token else None,
        startup_timeout_s=s.startup_timeout_s,
        rollout_threads=local_rollout_threads(config, settings.device.type),
        environment=(s.environment or s.reward or "reward")
        if config.training.tools.episode_environments
        else None,
        reward_settings=local_reward_settings(config),
        gateway=config.training.agents is not None,
    )
    stack.callback(local.close)
    reward = s.reward if s.reward is not None else local.reward_target
    rollout = s.rollout if s.rollout is not None else [local.rollout_target]
    return channel_configs(config, settings, reward, rollout)


def _with_local_agent(config: RunConfig, stack: ExitStack, sink: EventSink) -> RunConfig:
    """``config`` with ``training.agents.command`` started, its address as ``target`` (stopped when
    ``stack`` closes)."""
    agents = config.training.agents
    if agents is None or agents.command is None:
        return config
    sink(JobEvent(step=0, total_steps=0, state=RunState.PENDING, message="starting the agent"))
    agent = start_agent(
        agents.command,
        log_dir=config.output_dir / "services",
        startup_timeout_s=config.services.startup_timeout_s,
    )
    stack.callback(agent.stop)
    started = agents.model_copy(update={"target": [agent.target], "command": None})
    training = config.training.model_copy(update={"agents": started})
    return config.model_copy(update={"training": training})


def reward_requirements(client: RewardClient, terms: Sequence[RewardTerm]) -> dict[str, tuple[str, ...]]:
    """Check every configured reward is offered (and available) on the reward service; return the metadata
    each needs, from the service's ``required_metadata`` ("a|b" = column a or b)."""
    offered = {info.name: info for info in client.list_rewards()}
    requirements = dict(REWARD_METADATA)
    for term in terms:
        key = "training.rewards.prm" if term.name.startswith("prm:") else "training.rewards.reward_fn"
        info = offered.get(term.name)
        if info is None:
            if term.name.startswith(("prm:", "orm:", "judge:")):
                continue  # models are loaded at run time; the Score call reports a missing one
            names = ", ".join(sorted(offered))
            raise ConfigError(
                f"reward {term.name!r} is not offered by the reward service (offered: {names})", key=key
            )
        if not info.available:
            raise ConfigError(
                f"reward {term.name!r} is unavailable on the reward service: {info.status}", key=key
            )
        requirements[term.name] = tuple(info.required_metadata)
    return requirements


def resolve_checkpoint(config: RunConfig, resume: bool) -> str | None:
    """The checkpoint to resume from: ``training.resume_from_checkpoint`` (a path, or true = the newest
    complete one in the output dir), or the newest complete one when ``resume`` is requested; None starts
    fresh. Complete: see :mod:`~trainer_service.training.checkpoints`."""
    wanted = config.training.resume_from_checkpoint
    key = "training.resume_from_checkpoint"
    if isinstance(wanted, str):
        if not Path(wanted).is_dir():
            raise ConfigError(f"checkpoint {wanted!r} does not exist", key=key)
        if not is_complete(Path(wanted)):
            raise ConfigError(f"checkpoint {wanted!r} has no readable trainer_state.json", key=key)
        return wanted
    if (wanted is True or resume) and config.output_dir.is_dir():
        newest = last_complete_checkpoint(config.output_dir)
        return str(newest) if newest else None
    return None


def run_job(
    config: RunConfig,
    *,
    sink: EventSink = discard,
    stop_flag: StopFlag | None = None,
    resume: bool = False,
) -> JobResult:
    """Train one run to completion (or until ``stop_flag`` is set); emits events to ``sink``."""
    # rollout_func is marked experimental in TRL; the warning says nothing actionable here.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if config.training.rollout.async_rollout and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The lookahead reads this process's sampler; other ranks would prefetch different prompts.
        raise ConfigError("supports single-process runs only", key="training.rollout.async_rollout")
    if config.training.sampling.curriculum is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Each rank counts only its own slice's rewards: the ranks' weights, and their samplers, would differ.
        raise ConfigError("supports single-process runs only", key="training.sampling.curriculum")
    if config.training.sampling.dynamic_sampling is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Each rank would draw its own number of replacement rounds, and TRL's gathers would deadlock.
        raise ConfigError("supports single-process runs only", key="training.sampling.dynamic_sampling")
    # Read the data first: a missing file or a malformed row fails before any service is started.
    rows = {split: read_split(config.data, split=split) for split in ("train", "eval")}
    settings = JobSettings.of(config)
    config, _ = resolve_batch_size(config, settings.device)
    checkpoint = resolve_checkpoint(config, resume)
    with ExitStack() as stack:
        config, endpoints = resolve_services(config, settings, stack, sink)
        cpu = settings.device.type == "cpu"
        threads = trainer_cpu_threads(config, "cpu", endpoints.rollout.target) if cpu else None
        if threads is not None:
            # Restored on exit: an in-process caller (a benchmark, a test) keeps its own setting.
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
        return _train(
            config,
            endpoints,
            rows,
            settings=settings,
            checkpoint=checkpoint,
            sink=sink,
            stop_flag=stop_flag,
            stack=stack,
        )


def _train(
    config: RunConfig,
    endpoints: Endpoints,
    rows: dict[str, list[dict[str, Any]] | None],
    *,
    settings: JobSettings,
    checkpoint: str | None,
    sink: EventSink,
    stop_flag: StopFlag | None,
    stack: ExitStack,
) -> JobResult:
    """Build the job's parts in order (:mod:`~.assembly`), train, and save its outputs."""
    set_seed(config.training.seed)
    config.output_dir.mkdir(parents=True, exist_ok=True)
    reward_client = open_reward_client(config, endpoints.reward, stack)
    requirements = reward_requirements(reward_client, settings.reward_terms)
    data = build_data(config, rows, settings.reward_terms, requirements)
    plan = importance_sampling_plan(config, settings.device, endpoints.rollout)
    objective = build_objective(
        config, settings, data, reward_client, checkpoint=checkpoint, importance_sampling=plan
    )
    rollout = build_rollout(config, settings, endpoints, data.episodes, stack, agents=data.agents)
    callbacks = build_callbacks(
        config, settings, data, objective, rollout, reward_client, sink=sink, stop_flag=stop_flag
    )
    trainer = build_trainer(config, data, objective, rollout, callbacks)
    trainer.train(resume_from_checkpoint=checkpoint)
    return _save_outputs(config.output_dir, trainer, data.tokenizer, rollout.sync, callbacks)


def _save_outputs(
    output_dir: Path,
    trainer: GRPOTrainer,
    tokenizer: PreTrainedTokenizerBase,
    sync: WeightSync,
    callbacks: Callbacks,
) -> JobResult:
    """After training: the model and tokenizer of a completed run, and the reward curve of any run."""
    state = trainer.state
    halted = callbacks.guard is not None and callbacks.guard.halted is not None
    ended = RunState.STOPPED if callbacks.stop.stopped_early or halted else RunState.COMPLETED
    metrics_path = output_dir / METRICS_FILE
    curve = None
    if ended is RunState.COMPLETED:
        # Collective under DeepSpeed/FSDP; writes on the main process only.
        trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        if ended is RunState.COMPLETED:
            tokenizer.save_pretrained(str(output_dir))
        if metrics_path.exists():
            curve = plot_reward_curve(
                metrics_path, output_dir / REWARD_CURVE_FILE, output_dir / EVAL_METRICS_FILE
            )
    return JobResult(
        state=ended,
        step=int(state.global_step),
        total_steps=int(state.max_steps),
        output_dir=output_dir,
        metrics_path=metrics_path,
        reward_curve=curve,
        policy_version=sync.current_version,
        weight_pushes=sync.pushes,
        push_seconds=sync.total_push_seconds,
    )
