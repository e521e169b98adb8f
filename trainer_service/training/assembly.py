"""The parts of one training job, each built by a named step from what the steps before it returned.

``trainer_service.training.job`` runs them in this order (each holds what the next needs):

1. :func:`open_reward_client` — the reward service, closed with the job;
2. :func:`build_data` — train/eval datasets (reward metadata checked), tokenizer, multi-turn episode plan;
3. :func:`build_objective` — GRPOConfig, policy model, reward functions, curriculum, importance-sampling
   and dynamic-sampling settings: what the trainer optimises and how;
4. :func:`build_rollout` — rollout replicas, weight sync and the ``rollout_func`` (async when configured);
5. :func:`build_callbacks` — weight sync, metrics, held-out evaluation, guards, curriculum and stop callbacks,
   in the order they must run;
6. :func:`build_trainer` — the loss-variant ``GRPOTrainer`` from those parts; the collaborators that act on
   the trainer are handed it by its own constructor (:mod:`~.trainer_binding`), never patched in afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase, ProcessorMixin, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from grpo_runtime.client import ChannelConfig
from reward_service.client import RewardClient
from trainer_service.config.reward_terms import RewardTerm
from trainer_service.config.run_config import ConfigError, RunConfig
from trainer_service.core.types import EventSink
from trainer_service.rollout.agent_episodes import AgentEpisodes, agent_episodes, uses_agent_reward
from trainer_service.rollout.agent_rollout import AgentRollout
from trainer_service.rollout.async_rollout import AsyncServiceRollout
from trainer_service.rollout.core_borrowing import CoreBorrowing
from trainer_service.rollout.cpu_placement import cpu_cores, overlap_threads, shares_cores_with_rollout
from trainer_service.rollout.episodes import EnvironmentReward, EpisodePlan, episode_plan, uses_env_reward
from trainer_service.rollout.replicas import RolloutReplicas
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync, WeightSyncCallback
from trainer_service.rollout.weight_transport import WeightTransports
from trainer_service.training.builders import (
    Device,
    build_grpo_config,
    build_model,
    load_processor,
    load_tokenizer,
)
from trainer_service.training.callbacks import MetricsCallback, StopCallback, StopFlag
from trainer_service.training.curriculum import Curriculum, CurriculumCallback
from trainer_service.training.data import check_prompt_lengths, to_dataset
from trainer_service.training.dynamic_sampling import DynamicSamplingSettings
from trainer_service.training.evaluation import EvaluationCallback, HeldOutEvaluator
from trainer_service.training.guard_callback import CompletionRecorder, GuardCallback
from trainer_service.training.guards import BaselineError, Guards
from trainer_service.training.importance_sampling import ImportanceSamplingPlan
from trainer_service.training.job_settings import Endpoints, JobSettings
from trainer_service.training.model_card import with_model_card
from trainer_service.training.rewards import BatchScorer
from trainer_service.training.sampler_hook import WrappedSamplerTrainer, chain
from trainer_service.training.trainer_binding import Binder
from trainer_service.training.variant_trainer import make_variant_trainer


@dataclass(frozen=True)
class JobData:
    """The rows a job trains and evaluates on, the tokenizer, and the multi-turn plan over those rows (None
    for a single-turn run), or the agent episodes over them (None without ``training.agents``)."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    tokenizer: PreTrainedTokenizerBase
    episodes: EpisodePlan | None
    agents: AgentEpisodes | None = None
    # TRL's processing_class: the tokenizer, or a vision-language policy's processor (whose tokenizer it is).
    processor: ProcessorMixin | None = None

    @property
    def processing_class(self) -> PreTrainedTokenizerBase | ProcessorMixin:
        return self.processor if self.processor is not None else self.tokenizer


@dataclass(frozen=True)
class Objective:
    """What the trainer optimises and how: the policy ``model``, TRL's ``args`` (the loss variant's fields),
    one TRL reward function per reward term (the environment's reward last), the curriculum that draws the
    prompts (or None), and the importance-sampling and dynamic-sampling settings."""

    args: GRPOConfig
    model: Any
    reward_funcs: list[Any]
    curriculum: Curriculum | None
    importance_sampling: ImportanceSamplingPlan
    dynamic_sampling: DynamicSamplingSettings | None


@dataclass(frozen=True)
class Rollout:
    """The rollout replicas, the weight sync that keeps them on the trainer's policy, and the
    ``rollout_func`` that generates from them (prefetching one step ahead with
    ``training.rollout.async_rollout``)."""

    replicas: RolloutReplicas
    sync: WeightSync
    func: ServiceRollout | AsyncServiceRollout


@dataclass(frozen=True)
class Callbacks:
    """The trainer's callbacks in the order they run, the ones the job reads after training, and the
    ``binders`` that hand the built trainer to the callbacks acting on it."""

    ordered: list[TrainerCallback]
    stop: StopCallback
    guard: GuardCallback | None
    binders: list[Binder]


def open_reward_client(config: RunConfig, reward: ChannelConfig, stack: ExitStack) -> RewardClient:
    """A client of the reward service at ``reward``, closed when ``stack`` closes."""
    client = RewardClient(
        reward, timeout_s=config.services.request_timeout_s, retry_budget_s=config.services.retry_timeout_s
    )
    stack.callback(client.close)
    return client


def build_data(
    config: RunConfig,
    rows: dict[str, list[dict[str, Any]] | None],
    terms: tuple[RewardTerm, ...],
    requirements: dict[str, tuple[str, ...]],
) -> JobData:
    """Datasets from the read ``rows`` (each row's reward metadata checked against ``requirements``), the
    tokenizer, prompt lengths checked against ``data.max_prompt_length`` (tokens), and the episode plan."""
    train = to_dataset(rows["train"], terms, split="train", requirements=requirements)
    held_out = to_dataset(rows["eval"], terms, split="eval", requirements=requirements)
    processor = load_processor(config)
    tokenizer = processor.tokenizer if processor is not None else load_tokenizer(config)
    limit = config.data.max_prompt_length
    if limit is not None:
        check_prompt_lengths(train, tokenizer, limit, split="train")
        if held_out is not None:
            check_prompt_lengths(held_out, tokenizer, limit, split="eval")
    end_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    episodes = episode_plan(config, train, held_out, end_token_id=end_token_id or 0)
    agents = agent_episodes(config, train, held_out, end_token_id=end_token_id or 0)
    return JobData(train, held_out, tokenizer, episodes, agents, processor)


def build_curriculum(
    config: RunConfig, data: JobData, terms: tuple[RewardTerm, ...], checkpoint: str | None
) -> Curriculum | None:
    """``training.sampling.curriculum`` over the train prompts, counting the first reward term; its counts
    restored from ``checkpoint`` when resuming."""
    if config.training.sampling.curriculum is None:
        return None
    curriculum = Curriculum(data.train["prompt"], config.training.sampling.curriculum, terms[0].name)
    if checkpoint is not None:
        curriculum.load(Path(checkpoint))
    return curriculum


def build_objective(
    config: RunConfig,
    settings: JobSettings,
    data: JobData,
    reward_client: RewardClient,
    *,
    checkpoint: str | None,
    importance_sampling: ImportanceSamplingPlan,
) -> Objective:
    """GRPOConfig and model (call after ``set_seed``: the adapter's initial weights are drawn here), and
    the reward functions, all terms scored by one reward-service call per batch."""
    t = config.training
    args = build_grpo_config(config, settings.device)
    model = build_model(config, settings.device)
    curriculum = build_curriculum(config, data, settings.reward_terms, checkpoint)
    observe = curriculum.observe_scored if curriculum is not None else None
    scorer = BatchScorer(
        reward_client,
        settings.reward_terms,
        config.training.generation.max_completion_length,
        observe=observe,
    )
    reward_funcs: list[Any] = scorer.reward_funcs()
    if uses_env_reward(config) or uses_agent_reward(config):
        reward_funcs.append(EnvironmentReward())  # its weight is last in reward_weights (build_grpo_config)
    return Objective(
        args=args,
        model=model,
        reward_funcs=reward_funcs,
        curriculum=curriculum,
        importance_sampling=importance_sampling,
        dynamic_sampling=(
            DynamicSamplingSettings(t.sampling.dynamic_sampling.max_gen_batches)
            if t.sampling.dynamic_sampling
            else None
        ),
    )


def build_weight_sync(config: RunConfig, device: Device, replicas: RolloutReplicas) -> WeightSync:
    """Weight sync to ``replicas`` over the configured transport (NCCL from a CUDA trainer, else gloo)."""
    t = config.training
    return WeightSync(
        replicas,
        enabled=t.rollout.weight_sync,
        sleep_mode=t.rollout.vllm_enable_sleep_mode,
        sleep_level=t.rollout.sleep_level,
        # One process streams its pushes from a thread; with several, every rank takes part in each push.
        background=int(os.environ.get("WORLD_SIZE", "1")) == 1,
        transports=WeightTransports(
            t.rollout.weight_transport,
            bucket_bytes=t.rollout.weight_bucket_mb << 20,
            group_host=t.rollout.weight_group_host,
            backend="nccl" if device.type == "cuda" else "gloo",
            device=str(device),
        ),
    )


def build_rollout(
    config: RunConfig,
    settings: JobSettings,
    endpoints: Endpoints,
    episodes: EpisodePlan | None,
    stack: ExitStack,
    agents: AgentEpisodes | None = None,
) -> Rollout:
    """Replicas, weight sync and ``rollout_func``, all closed when ``stack`` closes; with ``agents`` the
    completions are their episodes. With async rollout on a CPU machine shared with the rollout service,
    the trainer lends its cores to each prefetch."""
    t = config.training
    replicas = RolloutReplicas(endpoints.rollout_targets, endpoints.rollout)
    stack.callback(replicas.close)
    sync = build_weight_sync(config, settings.device, replicas)
    stack.callback(sync.close)
    sampling, group = SamplingConfig.from_run(config), t.generation.num_generations
    retry_timeout_s = config.services.retry_timeout_s
    service_rollout = (
        ServiceRollout(replicas, sync, sampling, group, retry_timeout_s=retry_timeout_s, episodes=episodes)
        if agents is None
        else AgentRollout(replicas, sync, sampling, group, agents, retry_timeout_s=retry_timeout_s)
    )
    if agents is not None:
        stack.callback(agents.close)
    func: ServiceRollout | AsyncServiceRollout = service_rollout
    if t.rollout.async_rollout:
        cores = None
        if shares_cores_with_rollout(config, settings.device.type, endpoints.rollout.target):
            cores = CoreBorrowing(share=overlap_threads()[0], total=cpu_cores())
            stack.callback(cores.detach)
        # An agent episode's calls may straddle a push: its tokens are bounded one by one, as partial ones.
        per_token = t.rollout.partial_rollouts or agents is not None
        func = AsyncServiceRollout(service_rollout, t.rollout.max_staleness, cores, partial=per_token)
    return Rollout(replicas=replicas, sync=sync, func=func)


def build_evaluation(
    config: RunConfig,
    settings: JobSettings,
    data: JobData,
    rollout: Rollout,
    reward_client: RewardClient,
    sink: EventSink,
) -> EvaluationCallback | None:
    """Held-out evaluation every ``training.evaluation.eval_steps`` steps, or None without those steps or
    eval rows."""
    t = config.training
    if not t.evaluation.eval_steps or data.eval is None:
        return None
    evaluator = HeldOutEvaluator(
        data.eval,
        rollout.replicas,
        rollout.sync,
        SamplingConfig.from_run(config),
        BatchScorer(reward_client, settings.reward_terms, config.training.generation.max_completion_length),
        data.tokenizer,
        num_samples=t.evaluation.num_generations_eval or t.generation.num_generations,
        threshold=t.evaluation.pass_threshold,
        retry_timeout_s=config.services.retry_timeout_s,
        episodes=data.episodes,
        agents=data.agents,
    )
    return EvaluationCallback(evaluator, t.evaluation.eval_steps, config.output_dir, sink)


def build_guard(
    config: RunConfig, rollout: Rollout, evaluation: EvaluationCallback | None, sink: EventSink
) -> GuardCallback | None:
    """The training guards (``training.guards``), recording each batch's completions, or None."""
    t = config.training
    if t.guards is None:
        return None
    try:
        guards = Guards(t.guards)
    except BaselineError as error:
        raise ConfigError(str(error), key="training.guards.eval_gate.baseline_file") from error
    recorder = CompletionRecorder(rollout.func)
    staleness = t.rollout.max_staleness if t.rollout.async_rollout else 0
    return GuardCallback(guards, config.output_dir, rollout.sync, recorder, evaluation, sink, staleness)


def progress_metrics(rollout: Rollout, curriculum: Curriculum | None) -> Callable[[], dict[str, Any]]:
    """What each metrics.jsonl record adds to TRL's metrics: policy version, weight pushes (seconds, rates),
    ready replicas, tool-call, async-rollout and curriculum metrics."""
    sync, func = rollout.sync, rollout.func

    def extra() -> dict[str, Any]:
        return {
            "policy_version": func.last_version,
            "weight_sync/push_seconds": sync.last_push_seconds if sync.pushes else None,
            **sync.push_metrics(),
            "rollout/replicas": len(sync.ready),
            **func.last_tool_metrics,
            **(func.metrics() if isinstance(func, AsyncServiceRollout) else {}),
            **(curriculum.metrics() if curriculum is not None else {}),
        }

    return extra


def build_callbacks(
    config: RunConfig,
    settings: JobSettings,
    data: JobData,
    objective: Objective,
    rollout: Rollout,
    reward_client: RewardClient,
    *,
    sink: EventSink,
    stop_flag: StopFlag | None,
) -> Callbacks:
    """The callbacks in the order they must run: weight sync first (each later callback sees the weights
    just pushed), metrics before evaluation (its resume truncation of eval_metrics.jsonl comes first),
    guards after evaluation (the eval gate reads its result), stop last."""
    stop = StopCallback(stop_flag)
    sync_callback = WeightSyncCallback(rollout.sync)
    evaluation = build_evaluation(config, settings, data, rollout, reward_client, sink)
    guard = build_guard(config, rollout, evaluation, sink)
    curriculum = objective.curriculum
    metrics = MetricsCallback(config.output_dir, sink, extra=progress_metrics(rollout, curriculum))
    optional = [evaluation, guard, CurriculumCallback(curriculum) if curriculum is not None else None]
    binders: list[Binder] = [part.bind for part in (sync_callback, evaluation, guard) if part is not None]
    return Callbacks(
        ordered=[sync_callback, metrics, *(part for part in optional if part is not None), stop],
        stop=stop,
        guard=guard,
        binders=binders,
    )


def build_trainer(
    config: RunConfig, data: JobData, objective: Objective, rollout: Rollout, callbacks: Callbacks
) -> GRPOTrainer:
    """The loss-variant trainer built from the parts, bound to its collaborators by its constructor."""
    func = rollout.func
    prefetching = func if isinstance(func, AsyncServiceRollout) else None
    curriculum = objective.curriculum
    # The curriculum draws the prompts; async rollout records what it drew (to know the next batch's prompts).
    wrappers: list[Callable[[Sampler], Sampler]] = [curriculum.wrap] if curriculum is not None else []
    wrappers += [prefetching.record] if prefetching is not None else []
    trainer_cls = with_model_card(
        make_variant_trainer(config.training.loss.variant, WrappedSamplerTrainer if wrappers else GRPOTrainer)
    )
    sampler_hook = {"wrap_sampler": chain(wrappers)} if wrappers else {}
    trainer = trainer_cls(
        **sampler_hook,
        model=objective.model,
        args=objective.args,
        reward_funcs=objective.reward_funcs,
        train_dataset=data.train,
        processing_class=data.processing_class,
        rollout_func=callbacks.guard.recorder if callbacks.guard is not None else func,
        importance_sampling=objective.importance_sampling,
        dynamic_sampling=objective.dynamic_sampling,
        callbacks=callbacks.ordered,
        # Async rollout reads prompts from the train dataset and lends cores to the trainer's model.
        binders=[*callbacks.binders, *([prefetching.attach] if prefetching is not None else [])],
    )
    # Our progress bar / events replace TRL's printed log dicts.
    trainer.remove_callback(PrinterCallback)
    return trainer
