"""One GRPO training job: model, data, rewards, rollout and weight sync wired into ``trl.GRPOTrainer``.

``run_job(config)`` is the whole run, used by the CLI (in-process) and by the service (in a worker process):

1. reward and rollout services: the configured addresses, or local ones started by
   :mod:`trainer_service.local.launcher`;
2. data: train/eval splits converted to GRPO rows, reward metadata checked before any generation;
3. model, tokenizer and GRPOConfig (:mod:`trainer_service.training.builders`);
4. rewards: one TRL reward function per ``reward_fn`` term, all terms scored by one reward-service call per
   batch (:mod:`trainer_service.training.rewards`), weights as TRL ``reward_weights``;
5. trainer: the loss-variant subclass of ``GRPOTrainer`` with ``rollout_func`` = the rollout service and
   callbacks for weight sync, metrics.jsonl/events and stop requests;
6. outputs in ``output/experiment_name``: ``metrics.jsonl``, ``checkpoint-N/`` every ``save_steps`` (adapter,
   optimizer, scheduler, RNG, data position, policy version), the final adapter and tokenizer, and
   ``reward_curve.png``.

What the job derives from the config (device and precision, reward terms, admin token) is computed once, in
:class:`JobSettings`, and passed down.

Multi-GPU: run ``accelerate launch --config_file ACC.yaml -m trainer_service train CONFIG.yaml`` with
``training.deepspeed_config`` or ``training.fsdp_config`` set and ``services.*`` pointing at running services;
see docs/trainer.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import set_seed
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.client import ChannelConfig
from reward_service.client import RewardClient
from rollout_service.client import RolloutClient
from trainer_service.config.run_config import ConfigError, RewardTerm, RunConfig, local_reward_settings
from trainer_service.core.types import EventSink, JobEvent, RunState, discard
from trainer_service.local.launcher import LocalServices, start_local_services
from trainer_service.rollout.async_rollout import AsyncServiceRollout
from trainer_service.rollout.core_borrowing import CoreBorrowing
from trainer_service.rollout.cpu_placement import (
    cpu_cores,
    local_rollout_threads,
    overlap_threads,
    shares_cores_with_rollout,
    trainer_cpu_threads,
)
from trainer_service.rollout.episodes import EnvironmentReward, episode_plan, uses_env_reward
from trainer_service.rollout.function_tools import check_served_tools
from trainer_service.rollout.replicas import RolloutReplicas
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync, WeightSyncCallback
from trainer_service.rollout.weight_transport import WeightTransports
from trainer_service.training.batch_sizing import resolve_batch_size
from trainer_service.training.builders import (
    Device,
    build_grpo_config,
    build_model,
    load_tokenizer,
    resolve_device,
)
from trainer_service.training.callbacks import (
    EVAL_METRICS_FILE,
    METRICS_FILE,
    MetricsCallback,
    StopCallback,
    StopFlag,
    plot_reward_curve,
)
from trainer_service.training.curriculum import Curriculum, CurriculumCallback
from trainer_service.training.data import REWARD_METADATA, check_prompt_lengths, read_split, to_dataset
from trainer_service.training.dynamic_sampling import DynamicSamplingSettings
from trainer_service.training.evaluation import EvaluationCallback, HeldOutEvaluator
from trainer_service.training.guard_callback import CompletionRecorder, GuardCallback
from trainer_service.training.guards import BaselineError, Guards
from trainer_service.training.importance_sampling import ImportanceSamplingPlan, resolve_importance_sampling
from trainer_service.training.rewards import BatchScorer
from trainer_service.training.sampler_hook import WrappedSamplerTrainer, chain
from trainer_service.training.variant_trainer import make_variant_trainer

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


@dataclass(frozen=True)
class JobSettings:
    """What a job derives from its run config, computed once at its start.

    ``device``: where the trainer computes and in which precision; ``reward_terms``: the rewards it scores
    with (``prm_reward`` replaces ``reward_fn``); ``admin_token``: the services' admin token (read from
    ``services.admin_token_file`` once).
    """

    device: Device
    reward_terms: tuple[RewardTerm, ...]
    admin_token: str | None

    @classmethod
    def of(cls, config: RunConfig) -> JobSettings:
        return cls(
            device=resolve_device(config),
            reward_terms=tuple(config.training.reward_terms),
            admin_token=config.services.resolved_admin_token(),
        )


@dataclass(frozen=True)
class Endpoints:
    """Channel configs of the reward and rollout services a job talks to.

    ``rollout`` holds the settings every rollout replica's channel copies (its target is the first entry);
    ``rollout_targets`` are the ``services.rollout`` entries (:mod:`trainer_service.rollout.replicas`).
    """

    reward: ChannelConfig
    rollout: ChannelConfig
    rollout_targets: tuple[str, ...]


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
    """``training.importance_sampling`` resolved for this run (:mod:`~.importance_sampling`)."""
    t = config.training
    return resolve_importance_sampling(
        t.importance_sampling,
        async_rollout=t.async_rollout,
        weight_sync=t.weight_sync,
        rollout_engine=rollout_engine(rollout) if t.importance_sampling == "auto" else None,
        trainer_fp32=device.fp32 and t.quantization == "none",
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
) -> Endpoints:
    """Configured service addresses, or local services started for this job (stopped when ``stack``
    closes).
    """
    s = config.services
    if config.training.tools and (s.environment or s.reward) is not None:
        # A service this run did not start must already offer the functions (it loads no caller's code).
        target = ChannelConfig(
            target=s.environment or s.reward, admin_token=settings.admin_token, tls_ca_file=s.tls_ca_file
        )
        check_served_tools(config.training.tools, target, s.request_timeout_s)
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
        environment=(s.environment or s.reward or "reward") if config.training.episode_environments else None,
        reward_settings=local_reward_settings(config),
    )
    stack.callback(local.close)
    reward = s.reward if s.reward is not None else local.reward.target
    rollout = s.rollout if s.rollout is not None else [local.rollout.target]
    return channel_configs(config, settings, reward, rollout)


def reward_requirements(client: RewardClient, terms: Sequence[RewardTerm]) -> dict[str, tuple[str, ...]]:
    """Check every configured reward is offered (and available) on the reward service; return the metadata
    each needs, from the service's ``required_metadata`` ("a|b" = column a or b)."""
    offered = {info.name: info for info in client.list_rewards()}
    requirements = dict(REWARD_METADATA)
    for term in terms:
        key = "training.prm_reward" if term.name.startswith("prm:") else "training.reward_fn"
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
    """The checkpoint to resume from: ``training.resume_from_checkpoint`` (a path, or true = newest in the
    output dir), or the newest one when ``resume`` is requested; None starts fresh."""
    wanted = config.training.resume_from_checkpoint
    if isinstance(wanted, str):
        if not Path(wanted).is_dir():
            raise ConfigError(f"checkpoint {wanted!r} does not exist", key="training.resume_from_checkpoint")
        return wanted
    if (wanted is True or resume) and config.output_dir.is_dir():
        return get_last_checkpoint(str(config.output_dir))
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
    if config.training.async_rollout and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The lookahead reads this process's sampler; other ranks would prefetch different prompts.
        raise ConfigError("supports single-process runs only", key="training.async_rollout")
    if config.training.curriculum is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Each rank counts only its own slice's rewards: the ranks' weights, and their samplers, would differ.
        raise ConfigError("supports single-process runs only", key="training.curriculum")
    if config.training.dynamic_sampling is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Each rank would draw its own number of replacement rounds, and TRL's gathers would deadlock.
        raise ConfigError("supports single-process runs only", key="training.dynamic_sampling")
    # Read the data first: a missing file or a malformed row fails before any service is started.
    rows = {split: read_split(config.data, split=split) for split in ("train", "eval")}
    settings = JobSettings.of(config)
    config, _ = resolve_batch_size(config, settings.device)
    checkpoint = resolve_checkpoint(config, resume)
    with ExitStack() as stack:
        endpoints = resolve_services(config, settings, stack, sink)
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
    t = config.training
    set_seed(t.seed)
    output_dir = config.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)

    terms = settings.reward_terms
    reward_client = RewardClient(
        endpoints.reward,
        timeout_s=config.services.request_timeout_s,
        retry_budget_s=config.services.retry_timeout_s,
    )
    stack.callback(reward_client.close)
    requirements = reward_requirements(reward_client, terms)
    train_dataset = to_dataset(rows["train"], terms, split="train", requirements=requirements)
    eval_dataset = to_dataset(rows["eval"], terms, split="eval", requirements=requirements)
    tokenizer = load_tokenizer(config)
    if config.data.max_prompt_length is not None:
        check_prompt_lengths(train_dataset, tokenizer, config.data.max_prompt_length, split="train")
        if eval_dataset is not None:
            check_prompt_lengths(eval_dataset, tokenizer, config.data.max_prompt_length, split="eval")

    args = build_grpo_config(config, settings.device)
    model = build_model(config, settings.device)

    curriculum = None
    if t.curriculum is not None:
        curriculum = Curriculum(train_dataset["prompt"], t.curriculum, terms[0].name)
        if checkpoint is not None:
            curriculum.load(Path(checkpoint))
    observe = curriculum.observe_scored if curriculum is not None else None
    scorer = BatchScorer(reward_client, terms, config.max_completion_length, observe=observe)
    reward_funcs: list[Any] = scorer.reward_funcs()
    end_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    episodes = episode_plan(config, train_dataset, eval_dataset, end_token_id=end_token_id or 0)
    if uses_env_reward(config):
        reward_funcs.append(EnvironmentReward())  # its weight is last in reward_weights (build_grpo_config)

    replicas = RolloutReplicas(endpoints.rollout_targets, endpoints.rollout)
    stack.callback(replicas.close)
    sync = WeightSync(
        replicas,
        enabled=t.weight_sync,
        sleep_mode=t.vllm_sleep_mode,
        sleep_level=t.sleep_level,
        background=t.async_rollout,
        transports=WeightTransports(
            t.weight_transport,
            bucket_bytes=t.weight_bucket_mb << 20,
            group_host=t.weight_group_host,
            backend="nccl" if settings.device.type == "cuda" else "gloo",
            device=str(settings.device),
        ),
    )
    stack.callback(sync.close)
    rollout: ServiceRollout | AsyncServiceRollout = ServiceRollout(
        replicas,
        sync,
        SamplingConfig.from_run(config),
        t.num_generations,
        retry_timeout_s=config.services.retry_timeout_s,
        episodes=episodes,
    )
    if t.async_rollout:
        cores = None
        if shares_cores_with_rollout(config, settings.device.type, endpoints.rollout.target):
            cores = CoreBorrowing(share=overlap_threads()[0], total=cpu_cores())
            stack.callback(cores.detach)
        rollout = AsyncServiceRollout(rollout, t.max_staleness, cores, partial=t.partial_rollouts)

    stop = StopCallback(stop_flag)
    sync_callback = WeightSyncCallback(sync)
    evaluation = None
    if t.eval_steps and eval_dataset is not None:
        evaluator = HeldOutEvaluator(
            eval_dataset,
            replicas,
            sync,
            SamplingConfig.from_run(config),
            BatchScorer(reward_client, terms, config.max_completion_length),
            tokenizer,
            num_samples=t.num_generations_eval or t.num_generations,
            threshold=t.eval_pass_threshold,
            retry_timeout_s=config.services.retry_timeout_s,
            episodes=episodes,
        )
        evaluation = EvaluationCallback(evaluator, t.eval_steps, output_dir, sink)
    guard_callback = None
    if t.guards is not None:
        try:
            guards = Guards(t.guards)
        except BaselineError as error:
            raise ConfigError(str(error), key="training.guards.eval_gate.baseline_file") from error
        recorder = CompletionRecorder(rollout)
        staleness = t.max_staleness if t.async_rollout else 0
        guard_callback = GuardCallback(guards, output_dir, sync, recorder, evaluation, sink, staleness)
    # Async rollout records the sampler's indices to know the next batch's prompts.
    prefetching = isinstance(rollout, AsyncServiceRollout)
    # The curriculum draws the prompts; async rollout records what it drew.
    wrappers = [curriculum.wrap] if curriculum is not None else []
    wrappers += [rollout.record] if prefetching else []
    trainer_cls = make_variant_trainer(t.grpo_variant, WrappedSamplerTrainer if wrappers else GRPOTrainer)
    sampler_hook = {"wrap_sampler": chain(wrappers)} if wrappers else {}
    trainer = trainer_cls(
        **sampler_hook,
        model=model,
        args=args,
        reward_funcs=reward_funcs,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        rollout_func=guard_callback.recorder if guard_callback is not None else rollout,
        importance_sampling=importance_sampling_plan(config, settings.device, endpoints.rollout),
        dynamic_sampling=(
            DynamicSamplingSettings(t.dynamic_sampling.max_gen_batches) if t.dynamic_sampling else None
        ),
        callbacks=[
            sync_callback,
            MetricsCallback(
                output_dir,
                sink,
                extra=lambda: {
                    "policy_version": rollout.last_version,
                    "weight_sync/push_seconds": sync.last_push_seconds if sync.pushes else None,
                    **sync.push_metrics(),
                    "rollout/replicas": len(sync.ready),
                    **rollout.last_tool_metrics,
                    **(rollout.metrics() if isinstance(rollout, AsyncServiceRollout) else {}),
                    **(curriculum.metrics() if curriculum is not None else {}),
                },
            ),
            *([evaluation] if evaluation is not None else []),
            *([guard_callback] if guard_callback is not None else []),
            *([CurriculumCallback(curriculum)] if curriculum is not None else []),
            stop,
        ],
    )
    sync_callback.trainer = trainer
    if evaluation is not None:
        evaluation.trainer = trainer
    if guard_callback is not None:
        guard_callback.trainer = trainer
    if isinstance(rollout, AsyncServiceRollout):
        rollout.attach(trainer)
    # Our progress bar / events replace TRL's printed log dicts.
    trainer.remove_callback(PrinterCallback)

    trainer.train(resume_from_checkpoint=checkpoint)

    state = trainer.state
    halted = guard_callback is not None and guard_callback.halted is not None
    ended = RunState.STOPPED if stop.stopped_early or halted else RunState.COMPLETED
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
