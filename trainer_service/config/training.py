"""The ``training:`` block of the run config, grouped by concern as TRL's ``GRPOConfig`` documents its fields.

Key names are TRL's wherever TRL has the same knob (``num_train_epochs``, ``learning_rate``, ``beta``,
``epsilon``, ``max_completion_length``, ``num_generations`` ...), soup-cli's where only it has one
(``reward_fn``, ``lora``, ``quantization``). Rules that span blocks are checked in
:mod:`trainer_service.config.run_config`; the old flat names are refused by
:mod:`trainer_service.config.retired_keys`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from trainer_service.config.agents import AgentsConfig
from trainer_service.config.curriculum import CurriculumConfig
from trainer_service.config.fields import FiniteParams, StrictModel
from trainer_service.config.guards import GuardsConfig
from trainer_service.config.reward_terms import RewardsConfig
from trainer_service.config.tools import ToolsConfig


class OptimizerConfig(StrictModel):
    """The optimizer, its schedule and the batch each optimizer step sees."""

    learning_rate: float = Field(default=1e-5, gt=0, le=1.0, description="Peak learning rate.")
    lr_scheduler_type: str = Field(default="constant", description="transformers' scheduler name.")
    warmup_ratio: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Fraction of the steps spent warming the learning rate up."
    )
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient norm clipped to this.")
    optim: str = Field(default="adamw_torch", description="transformers' optimizer name.")
    per_device_train_batch_size: int | Literal["auto"] = Field(
        default=8,
        description="Completions (not prompts) per device per micro-step, as TRL counts them. 'auto' = "
        "chosen at the job's start from memory, model size, sequence length and num_generations "
        "(trainer_service.config.auto_batch).",
    )
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-steps per optimizer step.")
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations in backward to save memory (slower; worth it for large models "
        "only).",
    )

    @field_validator("per_device_train_batch_size", mode="before")
    @classmethod
    def _batch_size_positive_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer >= 1 or 'auto', got {value!r}")
        if value < 1:
            raise ValueError("Input should be greater than or equal to 1 (or 'auto')")
        return value


class LoraConfig(StrictModel):
    """PEFT adapter settings; ``r: 0`` trains all weights instead (full fine-tuning)."""

    r: int = Field(default=16, ge=0, description="Adapter rank; 0 = full fine-tuning, no adapter.")
    alpha: float = Field(default=32.0, gt=0, description="LoRA scaling α (the update is scaled by α/r).")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", description="'all-linear' (PEFT's shortcut) or explicit module names."
    )
    use_dora: bool = Field(default=False, description="Weight-decomposed LoRA (DoRA).")
    use_rslora: bool = Field(default=False, description="Rank-stabilised scaling α/√r.")
    train_vision_tower: bool = Field(
        default=False,
        description="A vision-language policy: adapt (or, at r 0, train) its vision tower and projector too; "
        "false = only its language model is adapted or trained, the vision side stays frozen.",
    )


class ModelConfig(StrictModel):
    """How the policy is loaded and placed: adapter, quantization, device and multi-GPU sharding."""

    lora: LoraConfig = Field(default_factory=LoraConfig, description="The PEFT adapter trained on the base.")
    quantization: Literal["none", "4bit", "8bit"] = Field(
        default="none", description="Load the base quantized with bitsandbytes (QLoRA)."
    )
    deepspeed: str | FiniteParams | None = Field(
        default=None,
        description="A DeepSpeed config (file or mapping), passed through to TRL/accelerate for multi-GPU "
        "runs (launch with `accelerate launch`).",
    )
    fsdp_config: FiniteParams | None = Field(
        default=None, description="FSDP settings passed through to TRL/accelerate for multi-GPU runs."
    )
    device: Literal["cpu", "cuda"] | None = Field(
        default=None, description="Force a device; None = cuda when available."
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        description="torch threads of the trainer process on CPU; None = torch's default (one per core), "
        "except in async mode with the rollout service on this machine (loopback), where trainer and "
        "rollout split the cores while it generates and the trainer borrows them all once it is done "
        "(trainer_service.rollout.core_borrowing).",
    )


class GenerationConfig(StrictModel):
    """What the rollout service samples: the group of completions per prompt and the sampling range."""

    num_generations: int = Field(
        default=4,
        ge=2,
        description="Completions per prompt (the group size G); G >= 2 or group advantages are all zero.",
    )
    temperature: float = Field(
        default=1.0,
        ge=0.01,
        le=100.0,
        description="Sampling temperature (0 = greedy is not GRPO: a group of identical completions).",
    )
    top_p: float = Field(default=1.0, gt=0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(default=None, ge=-1, description="Top-k sampling; None or -1 = off.")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, description="Min-p sampling; None = off.")
    max_completion_length: int = Field(
        default=512,
        ge=1,
        description="Completion tokens at most (a tool episode's whole completion: calls, results and "
        "answer). Prompts are bounded by data.max_prompt_length.",
    )
    generation_seed: int | None = Field(
        default=None,
        description="Per-request generation seed base (step-dependent); None = nondeterministic sampling.",
    )


class LossConfig(StrictModel):
    """The objective: loss variant, clip range, KL penalty and advantage scaling (docs/losses.md)."""

    variant: str = Field(
        default="standard",
        description="Loss variant by name (trainer_service.config.variants); 'standard' = TRL's default "
        "loss.",
    )
    beta: float = Field(
        default=0.0, ge=0.0, description="KL coefficient β; 0 = no reference model is loaded."
    )
    epsilon: float = Field(default=0.2, gt=0, description="Lower clip range ε of the importance ratio.")
    epsilon_high: float | None = Field(
        default=None, gt=0, description="Upper clip range (DAPO's clip-higher); None = epsilon."
    )
    delta: float | None = Field(
        default=None,
        gt=0,
        description="two_sided: the clip half-width δ ∈ (0, 1]; clipped TRL variants: INTELLECT-2's upper "
        "cap on the ratio (> 1 + epsilon_high).",
    )
    params: FiniteParams = Field(
        default_factory=dict, description="Extra variant parameters (validated by the variant module)."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Advantage scaling: divide by the group's reward std, the batch's, or not at all (Dr. "
        "GRPO and GPG use 'none').",
    )
    mask_truncated_completions: bool = Field(
        default=False,
        description="Truncated completions (no EOS within max_completion_length) leave the loss (DAPO's "
        "overlong filter).",
    )
    importance_sampling: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Rollout importance-sampling correction (ratio of trainer to sampler log-probs): 'on', "
        "'off' (sync mode only), or 'auto' = on in async mode, with weight sync off, a vLLM engine or a "
        "bf16/fp16 trainer; otherwise (sync, fp32 HF engine: exactly on-policy) skipped while a check on the "
        "first and every 50th batch finds the ratio within 1 ± 1e-3 "
        "(trainer_service.training.importance_sampling).",
    )


class DynamicSamplingConfig(StrictModel):
    """DAPO's dynamic sampling (trainer_service.training.dynamic_sampling): groups whose rewards have no
    spread are dropped and replaced by groups of new prompts until the batch is full."""

    filter: Literal["zero_std"] = Field(
        default="zero_std", description="Which groups are dropped: those whose rewards are all equal."
    )
    max_gen_batches: int = Field(
        default=4,
        ge=2,
        le=64,
        description="Generation batches a step may use, the first included (verl's max_num_gen_batches); "
        "when they are spent the batch is filled up with dropped groups.",
    )


class SamplingConfig(StrictModel):
    """Which prompts and groups a step trains on."""

    dynamic_sampling: DynamicSamplingConfig | None = Field(
        default=None, description="DAPO dynamic sampling; None = train on every group."
    )
    curriculum: CurriculumConfig | None = Field(
        default=None,
        description="Sampling weights from per-prompt pass rates: prime-rl's easy/normal/hard pools.",
    )


class RolloutConfig(StrictModel):
    """How generation overlaps training and how new weights reach the rollout service."""

    async_rollout: bool = Field(
        default=False,
        description="Overlap generation of the next batch with the optimizer step (bounded by "
        "max_staleness versions).",
    )
    max_staleness: int = Field(
        default=1, ge=0, description="Policy versions an async batch's tokens may lag the trainer by."
    )
    partial_rollouts: bool = Field(
        default=True,
        description="Async mode: a weight push pauses the prefetch in flight, which continues with the new "
        "weights; tokens more than max_staleness versions old get zero loss weight. false: a too-stale "
        "prefetch is dropped whole and regenerated, and a push waits for the prefetch in flight.",
    )
    weight_sync: bool = Field(
        default=True,
        description="Push weights to the rollout service after each optimizer step (turn off only to prove "
        "it matters).",
    )
    weight_transport: Literal["auto", "grpc", "shared_memory", "distributed"] = Field(
        default="auto",
        description="How pushed weights reach each replica: auto, shared_memory = the replica's "
        "shared-memory directory when this process sees it (same host), else the gRPC stream; distributed = "
        "shared memory, else a torch.distributed group the trainer hosts at weight_group_host (gloo on CPU, "
        "nccl on CUDA); grpc = always the stream. A failed channel push is redone on the stream.",
    )
    weight_bucket_mb: int = Field(
        default=256, ge=1, le=4096, description="Size of one bucket of tensors on a channel, in MiB."
    )
    weight_group_host: str = Field(
        default="127.0.0.1",
        description="Address the replicas reach the trainer at for weight_transport: distributed.",
    )
    vllm_enable_sleep_mode: bool = Field(
        default=False,
        description="Trainer and rollout share one accelerator: wake → push → generate → sleep around each "
        "generation.",
    )
    sleep_level: Literal[1, 2] = Field(
        default=1, description="vLLM sleep level: 1 offloads the weights to CPU, 2 discards them."
    )


class EvaluationConfig(StrictModel):
    """Held-out evaluation on data.eval (trainer_service.training.evaluation: greedy accuracy, avg@n and
    pass@k per reward term, written to eval_metrics.jsonl)."""

    eval_steps: int = Field(
        default=0,
        ge=0,
        description="Evaluate at step 0, every this many optimizer steps and after the last; 0 = never.",
    )
    num_generations_eval: int | None = Field(
        default=None,
        ge=1,
        description="Sampled completions per eval prompt (n of avg@n and pass@k), beside one greedy; None = "
        "training.generation.num_generations.",
    )
    pass_threshold: float = Field(
        default=1.0,
        description="A completion passes a reward term (greedy accuracy, pass@k) when the term's value is at "
        "least this.",
    )


class TrainingConfig(StrictModel):
    """GRPO training: run length, logging and checkpoints here, every other concern in its own block."""

    num_train_epochs: float = Field(default=1.0, gt=0, description="Passes over data.train.")
    max_steps: int = Field(
        default=-1, ge=-1, description="Optimizer steps; -1 = derived from num_train_epochs."
    )
    seed: int = Field(
        default=42,
        description="Random seed of the run (transformers' seed and data_seed: data order, adapter init).",
    )
    logging_steps: int = Field(default=1, ge=1, description="Log metrics every this many optimizer steps.")
    save_steps: int = Field(
        default=0, ge=0, description="Checkpoint every this many optimizer steps; 0 = only the final save."
    )
    save_total_limit: int | None = Field(
        default=3, ge=1, description="Checkpoints kept (the oldest are deleted); None = all."
    )
    report_to: str | list[str] = Field(
        default="none", description="transformers' logging integrations ('tensorboard', 'wandb', ...)."
    )
    resume_from_checkpoint: str | bool | None = Field(
        default=None,
        description="A checkpoint directory, or true = the newest complete checkpoint in the output dir.",
    )
    guards: GuardsConfig | None = Field(
        default=None,
        description="Echo trap, reward-hacking signals, loss watchdog, eval gate: warn | halt | rollback.",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description=OptimizerConfig.__doc__)
    model: ModelConfig = Field(default_factory=ModelConfig, description=ModelConfig.__doc__)
    generation: GenerationConfig = Field(
        default_factory=GenerationConfig, description=GenerationConfig.__doc__
    )
    loss: LossConfig = Field(default_factory=LossConfig, description=LossConfig.__doc__)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig, description=RewardsConfig.__doc__)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description=SamplingConfig.__doc__)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description=RolloutConfig.__doc__)
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description=EvaluationConfig.__doc__
    )
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description=ToolsConfig.__doc__)
    agents: AgentsConfig | None = Field(
        default=None,
        description="Agents as rollout workers (grpo.agent.v1.AgentService) through the rollout service's "
        "OpenAI gateway; None = the policy generates through the rollout service alone.",
    )

    @field_validator("report_to")
    @classmethod
    def _report_to_known(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one integration or be 'none'")
        return value
