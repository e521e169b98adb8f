"""One GRPO training job: model, data, rewards, rollout and weight sync wired into ``trl.GRPOTrainer``.

``run_job(config)`` is the whole run, used by the CLI (in-process) and by the service (in a worker process):

1. reward and rollout services: the configured addresses, or local ones started by :mod:`launcher`;
2. data: train/eval splits converted to GRPO rows, reward metadata checked before any generation;
3. model: ``AutoModelForCausalLM`` (4/8-bit through bitsandbytes on CUDA only), PEFT LoRA/DoRA/rsLoRA
   unless ``lora.r`` is 0; precision as the seed chooses it: bf16 when the GPU supports it, else fp16 autocast
   with fp32 weights, fp32 on CPU;
4. rewards: one TRL reward function per ``reward_fn`` term, each scored by the reward service, weights as
   TRL ``reward_weights``;
5. trainer: the loss-variant subclass of ``GRPOTrainer`` with ``rollout_func`` = the rollout service and
   callbacks for weight sync, metrics.jsonl/events and stop requests;
6. outputs in ``output/experiment_name``: ``metrics.jsonl``, ``checkpoint-N/`` every ``save_steps`` (adapter,
   optimizer, scheduler, RNG, data position, policy version), the final adapter and tokenizer, and
   ``reward_curve.png``.

Multi-GPU: run ``accelerate launch --config_file ACC.yaml -m trainer_service train CONFIG.yaml`` with
``training.deepspeed_config`` or ``training.fsdp_config`` set and ``services.*`` pointing at running services;
see docs/trainer.md.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import TaskType, get_peft_model, prepare_model_for_kbit_training
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedTokenizerBase,
    set_seed,
)
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig

from grpo_runtime.client import ChannelConfig
from reward_service.client import RewardClient
from rollout_service.client import RolloutClient
from trainer_service.async_rollout import AsyncServiceRollout
from trainer_service.callbacks import METRICS_FILE, MetricsCallback, StopCallback, StopFlag, plot_reward_curve
from trainer_service.config import ConfigError, RewardTerm, RunConfig
from trainer_service.core_borrowing import CoreBorrowing
from trainer_service.data import REWARD_METADATA, check_prompt_lengths, read_split, to_dataset
from trainer_service.events import EventSink, JobEvent, RunState, discard
from trainer_service.launcher import (
    LocalServices,
    cpu_cores,
    is_loopback,
    overlap_threads,
    start_local_services,
)
from trainer_service.replicas import RolloutReplicas
from trainer_service.rollout import SamplingConfig, ServiceRollout
from trainer_service.variant_trainer import (
    ImportanceSamplingPlan,
    grpo_config_overrides,
    make_variant_trainer,
    resolve_importance_sampling,
)
from trainer_service.weight_sync import WeightSync, WeightSyncCallback

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
class Endpoints:
    """Channel configs of the reward and rollout services a job talks to.

    ``rollout`` holds the settings every rollout replica's channel copies (its target is the first entry);
    ``rollout_targets`` are the ``services.rollout`` entries (:mod:`trainer_service.replicas`).
    """

    reward: ChannelConfig
    rollout: ChannelConfig
    rollout_targets: tuple[str, ...]


def resolve_device(config: RunConfig) -> str:
    """``training.device``, or cuda when available, else cpu."""
    wanted = config.training.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("is 'cuda' but no CUDA device is available", key="training.device")
    return wanted or ("cuda" if torch.cuda.is_available() else "cpu")


def precision_flags(device: str) -> dict[str, bool]:
    """GRPOConfig ``bf16``/``fp16``: bf16 on GPUs that support it, fp16 on older GPUs, none on CPU."""
    if device != "cuda":
        return {"bf16": False, "fp16": False}
    if torch.cuda.is_bf16_supported():
        return {"bf16": True, "fp16": False}
    return {"bf16": False, "fp16": True}


def load_tokenizer(config: RunConfig) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(config.base)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "the tokenizer has no chat template; GRPO prompts are chat messages (add chat_template.jinja)",
            key="base",
        )
    return tokenizer


def quantization_config(
    config: RunConfig, device: str, compute_dtype: torch.dtype
) -> BitsAndBytesConfig | None:
    """bitsandbytes 4-bit (NF4, double quantization) or 8-bit loading; CUDA only."""
    mode = config.training.quantization
    if mode == "none":
        return None
    if device != "cuda":
        raise ConfigError(
            f"is {mode!r}, which needs a CUDA GPU (bitsandbytes); this run is on {device}; use 'none'",
            key="training.quantization",
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            f"is {mode!r} but bitsandbytes is not installed (extra `quantization`)",
            key="training.quantization",
        )
    if config.training.lora.r == 0:
        raise ConfigError(
            "quantized weights cannot be trained directly; set training.lora.r > 0 (QLoRA)",
            key="training.quantization",
        )
    if mode == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def build_model(config: RunConfig, device: str) -> torch.nn.Module:
    """The policy: base model (optionally quantized) with a PEFT adapter unless ``lora.r`` is 0."""
    t = config.training
    flags = precision_flags(device)
    # bf16 weights train fine under bf16 autocast; fp16 AMP needs fp32 master weights, as does CPU.
    dtype = torch.bfloat16 if flags["bf16"] else torch.float32
    quant = quantization_config(config, device, torch.bfloat16 if flags["bf16"] else torch.float16)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quant is not None:
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    model = AutoModelForCausalLM.from_pretrained(config.base, **kwargs)
    if quant is not None:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=t.gradient_checkpointing)
    if t.lora.r == 0:
        return model
    adapter = PeftLoraConfig(
        r=t.lora.r,
        lora_alpha=t.lora.alpha,
        lora_dropout=t.lora.dropout,
        target_modules=t.lora.target_modules,
        use_dora=t.lora.use_dora,
        use_rslora=t.lora.use_rslora,
        bias="none",
        task_type=TaskType.CAUSAL_LM,
    )
    return get_peft_model(model, adapter)


def _fsdp_kwargs(config: RunConfig) -> dict[str, Any]:
    """``training.fsdp_config`` → GRPOConfig ``fsdp`` (sharding strategy string) and ``fsdp_config``."""
    raw = config.training.fsdp_config
    if not raw:
        return {}
    rest = dict(raw)
    strategy = rest.pop("fsdp", "full_shard auto_wrap")
    return {"fsdp": strategy, "fsdp_config": rest}


def build_grpo_config(config: RunConfig, device: str) -> GRPOConfig:
    """TRL's GRPOConfig from the run config (the variant decides the loss fields)."""
    t = config.training
    terms = t.reward_terms
    weights = [term.weight for term in terms]
    overrides = grpo_config_overrides(
        t.grpo_variant,
        grpo_delta=t.grpo_delta,
        epsilon=t.grpo_epsilon,
        epsilon_high=t.grpo_epsilon_high,
        params=t.variant_params,
    )
    return GRPOConfig(
        output_dir=str(config.output_dir),
        num_train_epochs=t.epochs,
        max_steps=t.max_steps,
        learning_rate=t.lr,
        lr_scheduler_type=t.lr_scheduler_type,
        # transformers ≥ 5 reads a float < 1 as a fraction of the training steps.
        warmup_steps=t.warmup_ratio,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim=t.optim,
        per_device_train_batch_size=t.batch_size,
        per_device_eval_batch_size=t.batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        num_generations=t.num_generations,
        beta=t.grpo_beta,
        # The trainer recomputes logprobs as log_softmax(logits / temperature): must equal the sampling T.
        temperature=t.temperature,
        top_p=t.top_p,
        top_k=t.top_k or 0,
        min_p=t.min_p,
        max_completion_length=config.max_completion_length,
        reward_weights=weights if any(w != 1.0 for w in weights) else None,
        logging_steps=t.logging_steps,
        save_strategy="steps" if t.save_steps else "no",
        save_steps=t.save_steps or 500,
        save_total_limit=t.save_total_limit,
        eval_strategy="steps" if t.eval_steps and config.data.eval else "no",
        eval_steps=t.eval_steps or None,
        seed=t.seed,
        data_seed=t.seed,
        report_to=t.report_to,
        # Dataset columns (answer, tests, ...) must reach the reward functions.
        remove_unused_columns=False,
        use_cpu=device == "cpu",
        **precision_flags(device),
        gradient_checkpointing=t.gradient_checkpointing,
        deepspeed=t.deepspeed_config,
        **_fsdp_kwargs(config),
        disable_tqdm=True,
        log_completions=False,
        # "auto" may still skip it batch by batch (importance_sampling_plan); "off" never computes it.
        vllm_importance_sampling_correction=t.importance_sampling != "off",
        **overrides,
    )


def rollout_engine(channel: ChannelConfig) -> str | None:
    """The engine the rollout service at ``channel`` reports ("hf", "vllm"), or None when it does not answer
    now (the importance-sampling plan then keeps the correction on)."""
    try:
        with RolloutClient(channel) as client:
            return client.status(timeout_s=10.0).engine or None
    except grpc.RpcError:
        return None


def importance_sampling_plan(
    config: RunConfig, device: str, rollout: ChannelConfig
) -> ImportanceSamplingPlan:
    """``training.importance_sampling`` resolved for this run (see ``variant_trainer``'s module docstring)."""
    t = config.training
    flags = precision_flags(device)
    return resolve_importance_sampling(
        t.importance_sampling,
        async_rollout=t.async_rollout,
        weight_sync=t.weight_sync,
        rollout_engine=rollout_engine(rollout) if t.importance_sampling == "auto" else None,
        trainer_fp32=not (flags["bf16"] or flags["fp16"]) and t.quantization == "none",
    )


def overlapping_on_cpu(config: RunConfig) -> bool:
    """Async rollout with the trainer on CPU: trainer and rollout service compute at the same time."""
    return config.training.async_rollout and resolve_device(config) == "cpu"


def shares_cores_with_rollout(config: RunConfig, rollout_target: str) -> bool:
    """Whether the trainer splits this machine's cores with the rollout service (async on CPU, a loopback
    rollout, ``training.cpu_threads`` unset): its share while a prefetch generates, every core once that is
    done (:mod:`trainer_service.core_borrowing`)."""
    return config.training.cpu_threads is None and overlapping_on_cpu(config) and is_loopback(rollout_target)


def trainer_cpu_threads(config: RunConfig, rollout_target: str) -> int | None:
    """torch threads for this trainer process: ``training.cpu_threads``, else half the cores when it
    shares them with a rollout service on this machine (``launcher.overlap_threads``), else None (default)."""
    if config.training.cpu_threads is not None:
        return config.training.cpu_threads
    if shares_cores_with_rollout(config, rollout_target):
        return overlap_threads()[0]
    return None


def channel_configs(config: RunConfig, reward_target: str, rollout_targets: list[str]) -> Endpoints:
    s = config.services
    token = s.resolved_admin_token()
    common: dict[str, Any] = {"admin_token": token, "tls_ca_file": s.tls_ca_file}
    return Endpoints(
        reward=ChannelConfig(target=reward_target, default_timeout_s=s.request_timeout_s, **common),
        rollout=ChannelConfig(target=rollout_targets[0], default_timeout_s=s.request_timeout_s, **common),
        rollout_targets=tuple(rollout_targets),
    )


def resolve_services(config: RunConfig, stack: ExitStack, sink: EventSink) -> Endpoints:
    """Configured service addresses, or local services started for this job (stopped when ``stack``
    closes).
    """
    s = config.services
    if s.reward is not None and s.rollout is not None:
        return channel_configs(config, s.reward, s.rollout)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "must be set for multi-process runs (every rank would start its own services)",
            key="services.rollout",
        )
    sink(JobEvent(step=0, total_steps=0, state=RunState.PENDING, message="starting local services"))
    token = s.resolved_admin_token()
    local: LocalServices = start_local_services(
        need_reward=s.reward is None,
        need_rollout=s.rollout is None,
        model=s.rollout_model or config.base,
        engine=s.rollout_engine,
        log_dir=config.output_dir / "services",
        env={"GRPO_ADMIN_TOKEN": token} if token else None,
        startup_timeout_s=s.startup_timeout_s,
        rollout_threads=overlap_threads()[1] if overlapping_on_cpu(config) else None,
    )
    stack.callback(local.close)
    reward = s.reward if s.reward is not None else local.reward.target
    rollout = s.rollout if s.rollout is not None else [local.rollout.target]
    return channel_configs(config, reward, rollout)


def reward_requirements(client: RewardClient, terms: list[RewardTerm]) -> dict[str, tuple[str, ...]]:
    """Check every configured reward is offered (and available) on the reward service; return the metadata
    each needs, from the service's ``required_metadata`` ("a|b" = column a or b)."""
    offered = {info.name: info for info in client.list_rewards().rewards}
    requirements = dict(REWARD_METADATA)
    for term in terms:
        key = "training.prm_reward" if term.name.startswith("prm:") else "training.reward_fn"
        info = offered.get(term.name)
        if info is None:
            if term.name.startswith(("prm:", "orm:")):
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
    # Read the data first: a missing file or a malformed row fails before any service is started.
    rows = {split: read_split(config.data, split=split) for split in ("train", "eval")}
    device = resolve_device(config)
    checkpoint = resolve_checkpoint(config, resume)
    with ExitStack() as stack:
        endpoints = resolve_services(config, stack, sink)
        threads = trainer_cpu_threads(config, endpoints.rollout.target) if device == "cpu" else None
        if threads is not None:
            # Restored on exit: an in-process caller (a benchmark, a test) keeps its own setting.
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
        return _train(
            config,
            endpoints,
            rows,
            device=device,
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
    device: str,
    checkpoint: str | None,
    sink: EventSink,
    stop_flag: StopFlag | None,
    stack: ExitStack,
) -> JobResult:
    t = config.training
    set_seed(t.seed)
    output_dir = config.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)

    terms = t.reward_terms
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

    args = build_grpo_config(config, device)
    model = build_model(config, device)

    reward_funcs = [reward_client.as_reward_func((term.name, 1.0, term.params)) for term in terms]

    replicas = RolloutReplicas(endpoints.rollout_targets, endpoints.rollout)
    stack.callback(replicas.close)
    sync = WeightSync(
        replicas,
        enabled=t.weight_sync,
        sleep_mode=t.vllm_sleep_mode,
        sleep_level=t.sleep_level,
        background=t.async_rollout,
    )
    rollout: ServiceRollout | AsyncServiceRollout = ServiceRollout(
        replicas,
        sync,
        SamplingConfig.from_run(config),
        t.num_generations,
        retry_timeout_s=config.services.retry_timeout_s,
    )
    if t.async_rollout:
        cores = None
        if shares_cores_with_rollout(config, endpoints.rollout.target):
            cores = CoreBorrowing(share=overlap_threads()[0], total=cpu_cores())
            stack.callback(cores.detach)
        rollout = AsyncServiceRollout(rollout, t.max_staleness, cores)

    stop = StopCallback(stop_flag)
    sync_callback = WeightSyncCallback(sync)
    trainer_cls = make_variant_trainer(t.grpo_variant)
    trainer = trainer_cls(
        model=model,
        args=args,
        reward_funcs=reward_funcs,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
        importance_sampling=importance_sampling_plan(config, device, endpoints.rollout),
        callbacks=[
            sync_callback,
            MetricsCallback(
                output_dir,
                sink,
                extra=lambda: {
                    "policy_version": rollout.last_version,
                    "weight_sync/push_seconds": sync.last_push_seconds if sync.pushes else None,
                    "rollout/replicas": len(sync.ready),
                    **(rollout.metrics() if isinstance(rollout, AsyncServiceRollout) else {}),
                },
            ),
            stop,
        ],
    )
    sync_callback.trainer = trainer
    if isinstance(rollout, AsyncServiceRollout):
        rollout.attach(trainer)
    # Our progress bar / events replace TRL's printed log dicts.
    trainer.remove_callback(PrinterCallback)

    trainer.train(resume_from_checkpoint=checkpoint)

    state = trainer.state
    ended = RunState.STOPPED if stop.stopped_early else RunState.COMPLETED
    metrics_path = output_dir / METRICS_FILE
    curve = None
    if ended is RunState.COMPLETED:
        # Collective under DeepSpeed/FSDP; writes on the main process only.
        trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        if ended is RunState.COMPLETED:
            tokenizer.save_pretrained(str(output_dir))
        if metrics_path.exists():
            curve = plot_reward_curve(metrics_path, output_dir / REWARD_CURVE_FILE)
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
