"""Training-run configuration: the YAML a user writes, validated with pydantic.

Key names follow soup-cli's GRPO trainer (``base``, ``output``, ``data.train``, ``training.lr``,
``training.reward_fn``, ``training.lora.r`` ...) plus a ``services`` block with the reward and rollout
addresses. Every model forbids unknown keys, and every error names the dotted key it is about
(``training.lora.r: ...``). No number anywhere in the config may be NaN or infinite: every float field refuses
them (``allow_inf_nan=False`` on every model) and so does every free-form parameter mapping
(:data:`FiniteParams`), so a hostile ``lr: .nan`` never reaches the optimizer.

Example::

    base: tests/assets/models/policy
    output: runs
    experiment_name: demo
    data: {train: data/train.jsonl, max_prompt_length: 128}
    training:
      max_steps: 50
      batch_size: 8            # completions per device per micro-step (TRL counts completions)
      num_generations: 4
      reward_fn: "accuracy:1.0,format:0.2"
      lora: {r: 8, alpha: 16}
    services: {reward: 127.0.0.1:50051, rollout: 127.0.0.1:50052}
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

# A config that cannot run raises the runtime's ConfigError naming the dotted key (``training.lr: must be
# > 0``), so whatever handles a service's config error handles a run config's too.
from grpo_runtime.config import ConfigError, safe_load_yaml, validation_errors
from trainer_service.config.curriculum import CurriculumConfig
from trainer_service.config.guards import GuardsConfig
from trainer_service.config.rollout_targets import parse_target
from trainer_service.config.variants import (
    PAPER_CLIP_RANGES,
    normalize_variant,
    validate_variant_params,
)

# |weight| of one reward term; larger weights only overflow the weighted sum.
MAX_REWARD_WEIGHT = 1e6


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _non_finite_at(value: Any, path: str = "") -> str | None:
    """The dotted path of the first NaN/inf float inside nested dicts and lists, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "value"
    if isinstance(value, dict):
        items = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for inner_path, item in items:
        found = _non_finite_at(item, inner_path)
        if found is not None:
            return found
    return None


def _all_finite(value: Any) -> Any:
    found = _non_finite_at(value)
    if found is not None:
        raise ValueError(f"holds a non-finite number (NaN or infinity) at {found}")
    return value


# A free-form parameter mapping (reward, variant and backend parameters): any JSON-like value, numbers finite.
FiniteParams = Annotated[dict[str, Any], AfterValidator(_all_finite)]


# A data source that generates its rows instead of reading a file: ``reasoning_gym:<task>``.
GENERATED_PREFIX = "reasoning_gym:"


def generated_task(source: str | None) -> str | None:
    """The reasoning-gym task of a ``data.train``/``data.eval`` value, None when it names a file."""
    if source is not None and source.startswith(GENERATED_PREFIX):
        return source[len(GENERATED_PREFIX) :]
    return None


class GeneratedData(_Strict):
    """Rows of a ``reasoning_gym:<task>`` source: ``size`` entries (eval: ``eval_size``) generated with
    ``seed`` (eval: ``seed + size``: reasoning-gym draws entry ``i`` from ``Random(seed + i)``, so eval rows
    are other draws than train rows), the task built with ``config`` (its config dataclass's fields), a system
    message from reasoning-gym's ``SYSTEM_PROMPTS[system_prompt]`` (None: no system message). Loading the
    data refuses a task the reward service withholds and a ``config`` value past its bound (see
    ``trainer_service.training.data.generate_rows``)."""

    size: int = Field(default=1000, ge=1, le=1_000_000)
    eval_size: int = Field(default=100, ge=1, le=100_000)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    config: FiniteParams = Field(default_factory=dict)
    system_prompt: str | None = "default"


class DataConfig(_Strict):
    """Where prompts come from and how long they may be.

    ``train``/``eval``: a local JSONL, JSON or Parquet file, or a directory written by
    ``datasets.Dataset.save_to_disk`` (a ``DatasetDict`` directory takes its ``train``/``test`` split), or
    ``reasoning_gym:<task>``: rows reasoning-gym generates as the ``reasoning_gym`` block says
    (:class:`GeneratedData`).
    ``format``: ``auto`` detects per row; the others force one of soup-cli's layouts.
    """

    train: str
    eval: str | None = None
    reasoning_gym: GeneratedData = Field(default_factory=GeneratedData)
    format: Literal["auto", "messages", "prompt", "dpo", "alpaca"] = "auto"
    # Longest prompt + completion in tokens, as in soup-cli; also the default completion length.
    max_length: int = Field(default=512, ge=8)
    # Prompts longer than this many tokens are rejected by the data check (None = no limit).
    max_prompt_length: int | None = Field(default=None, ge=1)


class LoraConfig(_Strict):
    """PEFT adapter settings; ``r: 0`` trains all weights instead (full fine-tuning)."""

    r: int = Field(default=16, ge=0)
    alpha: float = Field(default=32.0, gt=0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    # "all-linear" (PEFT's shortcut) or explicit module names.
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    use_dora: bool = False
    use_rslora: bool = False


class RewardTerm(_Strict):
    """One reward function of the sum ``R = Σ weight·value`` (TRL ``reward_weights``)."""

    name: str
    weight: float = Field(default=1.0, ge=-MAX_REWARD_WEIGHT, le=MAX_REWARD_WEIGHT)
    params: FiniteParams = Field(default_factory=dict)


class EnvironmentSpec(_Strict):
    """A tool environment episodes run against (grpo.env.v1 ``OpenEpisode``): its name and params."""

    name: str = Field(min_length=1)
    params: FiniteParams = Field(default_factory=dict)


def _environment_spec(value: Any) -> Any:
    """``calculator`` is ``{name: calculator}``."""
    return {"name": value} if isinstance(value, str) else value


EnvironmentEntry = Annotated[EnvironmentSpec, BeforeValidator(_environment_spec)]

# The environment of training.tools in a locally spawned reward service's `environments.functions`.
TOOLS_ENVIRONMENT = "tools"


def _function_path(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        raise ValueError(f"{value!r} is not 'module:function'")
    return value


FunctionPath = Annotated[str, AfterValidator(_function_path)]


class DynamicSamplingConfig(_Strict):
    """DAPO's dynamic sampling (trainer_service.training.dynamic_sampling): groups whose rewards have no
    spread are dropped and replaced by groups of new prompts until the batch is full.

    ``max_gen_batches``: generation batches a step may use, the first included (verl's
    ``max_num_gen_batches``); when they are spent the batch is filled up with dropped groups."""

    filter: Literal["zero_std"] = "zero_std"
    max_gen_batches: int = Field(default=4, ge=2, le=64)


class TrainingConfig(_Strict):
    """GRPO hyperparameters (TRL names in comments where they differ)."""

    epochs: float = Field(default=1.0, gt=0)  # num_train_epochs
    # Optimizer steps; -1 = derived from epochs.
    max_steps: int = Field(default=-1, ge=-1)
    lr: float = Field(default=1e-5, gt=0, le=1.0)  # learning_rate
    # Completions (not prompts) per device per micro-step: TRL per_device_train_batch_size. "auto" = chosen
    # at the job's start from memory, model size, sequence length and G (trainer_service.config.auto_batch).
    batch_size: int | Literal["auto"] = 8
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    # Completions per prompt (the group size G); G >= 2 or group advantages are all zero.
    num_generations: int = Field(default=4, ge=2)
    grpo_beta: float = Field(default=0.0, ge=0.0)  # KL coefficient β
    # Advantage scaling (TRL scale_rewards): divide by the group's reward std, the batch's, or not at all
    # (Dr. GRPO and GPG use "none").
    scale_rewards: Literal["group", "batch", "none"] = "group"
    # Truncated completions (no EOS within max_completion_length) leave the loss (DAPO's overlong filter).
    mask_truncated_completions: bool = False
    # DAPO dynamic sampling; None = train on every group.
    dynamic_sampling: DynamicSamplingConfig | None = None
    # Loss variant by name (see trainer_service.config.variants); "standard" = TRL's default loss.
    grpo_variant: str = "standard"
    grpo_delta: float | None = Field(default=None, gt=0)
    grpo_epsilon: float = Field(default=0.2, gt=0)
    grpo_epsilon_high: float | None = Field(default=None, gt=0)
    # Extra variant parameters (validated by the variant module).
    variant_params: FiniteParams = Field(default_factory=dict)
    # The rollout service's sampling range (0 = greedy is not GRPO: a group of identical completions).
    temperature: float = Field(default=1.0, ge=0.01, le=100.0)
    top_p: float = Field(default=1.0, gt=0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    # None = data.max_length.
    max_completion_length: int | None = Field(default=None, ge=1)
    # "accuracy,format" or "accuracy:2.0,format:0.5"; a loaded model is "prm:NAME" / "orm:NAME".
    reward_fn: str = "accuracy"
    # Per-reward parameters, by reward name: {"length": {"max_len": 64}}.
    reward_params: dict[str, FiniteParams] = Field(default_factory=dict)
    # Name of a PRM loaded on the reward service; when set it REPLACES reward_fn (as in soup-cli).
    prm_reward: str | None = None
    prm_aggregate: Literal["min", "prod", "last", "mean"] = "min"
    lora: LoraConfig = Field(default_factory=LoraConfig)
    quantization: Literal["none", "4bit", "8bit"] = "none"
    # Trainer and rollout share one accelerator: wake → push → generate → sleep around each generation.
    vllm_sleep_mode: bool = False
    sleep_level: Literal[1, 2] = 1
    logging_steps: int = Field(default=1, ge=1)
    # Checkpoint every this many optimizer steps; 0 = only the final save.
    save_steps: int = Field(default=0, ge=0)
    save_total_limit: int | None = Field(default=3, ge=1)
    seed: int = 42
    report_to: str | list[str] = "none"
    # A checkpoint directory, or true = the newest checkpoint in the output dir.
    resume_from_checkpoint: str | bool | None = None
    # Passed through to TRL/accelerate for multi-GPU runs (launch with `accelerate launch`).
    deepspeed_config: str | FiniteParams | None = None
    fsdp_config: FiniteParams | None = None
    # Overlap generation of the next batch with the optimizer step (bounded by max_staleness versions).
    async_rollout: bool = False
    max_staleness: int = Field(default=1, ge=0)
    # Async mode: a weight push pauses the prefetch in flight, which continues with the new weights (partial
    # rollouts); tokens more than max_staleness versions old get zero loss weight. false: a too-stale
    # prefetch is dropped whole and regenerated, and a push waits for the prefetch in flight.
    partial_rollouts: bool = True
    # Rollout importance-sampling correction (ratio of trainer to sampler log-probs): "on", "off" (sync mode
    # only), or "auto" = on in async mode, with weight sync off, a vLLM engine or a bf16/fp16 trainer;
    # otherwise (sync, fp32 HF engine: exactly on-policy) skipped while a check on the first and every 50th
    # batch finds the ratio within 1 ± 1e-3 (trainer_service.training.importance_sampling, docs/trainer.md).
    importance_sampling: Literal["auto", "on", "off"] = "auto"
    # torch threads of the trainer process on CPU; None = torch's default (one per core), except in async mode
    # with the rollout service on this machine (loopback), where trainer and rollout split the cores while it
    # generates and the trainer borrows them all once it is done (trainer_service.rollout.core_borrowing).
    cpu_threads: int | None = Field(default=None, ge=1)
    # Push weights to the rollout service after each optimizer step (turn off only to prove it matters).
    weight_sync: bool = True
    # How pushed weights reach each replica (trainer_service.rollout.weight_transport): auto, shared_memory:
    # the replica's shared-memory directory when this process sees it (same host), else the gRPC stream;
    # distributed = shared memory, else a torch.distributed group the trainer hosts at weight_group_host
    # (gloo on CPU, nccl on CUDA); grpc = always the stream. A failed channel push is redone on the stream.
    weight_transport: Literal["auto", "grpc", "shared_memory", "distributed"] = "auto"
    # Size of one bucket of tensors on a channel, in MiB.
    weight_bucket_mb: int = Field(default=256, ge=1, le=4096)
    # Address the replicas reach the trainer at for weight_transport: distributed.
    weight_group_host: str = "127.0.0.1"
    # Evaluate on data.eval at step 0, every this many optimizer steps and after the last; 0 = never
    # (trainer_service.training.evaluation: greedy accuracy, avg@n, pass@k per reward in eval_metrics.jsonl).
    eval_steps: int = Field(default=0, ge=0)
    # Sampled completions per eval prompt (n of avg@n and pass@k), beside one greedy; None = num_generations.
    num_generations_eval: int | None = Field(default=None, ge=1)
    # A completion passes a reward term (greedy accuracy, pass@k) when the term's value is at least this.
    eval_pass_threshold: float = 1.0
    # Echo trap, reward-hacking signals, loss watchdog, eval gate: warn | halt | rollback (config/guards.py).
    guards: GuardsConfig | None = None
    # Sampling weights from per-prompt pass rates: prime-rl's easy/normal/hard pools (config/curriculum.py).
    curriculum: CurriculumConfig | None = None
    # Recompute activations in backward to save memory (slower; worth it for large models only).
    gradient_checkpointing: bool = False
    warmup_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    lr_scheduler_type: str = "constant"
    optim: str = "adamw_torch"
    # Force a device ("cpu", "cuda"); None = cuda when available.
    device: Literal["cpu", "cuda"] | None = None
    # Per-request generation seed base (step-dependent); None = nondeterministic sampling.
    generation_seed: int | None = None
    # Multi-turn tool episodes (TRL's names): one environment, or several (a row picks one by its
    # `environment` column, default the first), served by services.environment or else services.reward.
    environment: EnvironmentEntry | None = None
    environments: list[EnvironmentEntry] | None = Field(default=None, min_length=1)
    # TRL's tools=: plain functions ('module:function') as the episodes' tools, served by the locally
    # spawned reward service (written into its settings: it imports code only from its own settings). Over
    # StartRun only entries in the trainer service's allowed_tools pass (trainer_service.core.confinement).
    tools: list[FunctionPath] | None = Field(default=None, min_length=1)
    # Tool-calling rounds per episode (TRL max_tool_calling_iterations); max_turns counts model turns
    # (iterations + 1). None = the rollout service's limits.
    max_tool_calling_iterations: int | None = Field(default=None, ge=0)
    max_turns: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=0)
    # Weight of the environment's own reward (GetReward) beside reward_fn's terms; 0 = not a reward term.
    env_reward_weight: float = Field(default=1.0, ge=0.0)

    @field_validator("reward_fn")
    @classmethod
    def _reward_fn_parses(cls, value: str) -> str:
        parse_reward_fn(value)
        return value

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size_positive_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer >= 1 or 'auto', got {value!r}")
        if value < 1:
            raise ValueError("Input should be greater than or equal to 1 (or 'auto')")
        return value

    @field_validator("report_to")
    @classmethod
    def _report_to_known(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one integration or be 'none'")
        return value

    @field_validator("importance_sampling")
    @classmethod
    def _correction_stays_on_in_async(cls, value: str, info: ValidationInfo) -> str:
        # Declared after async_rollout, so info.data holds it; the error names training.importance_sampling.
        if value == "off" and info.data.get("async_rollout"):
            raise ValueError(
                "cannot be 'off' with training.async_rollout: async batches come from older weights and only "
                "the correction makes training on them unbiased (use auto or on)"
            )
        return value

    @model_validator(mode="after")
    def _one_environment_form(self) -> TrainingConfig:
        if self.environment is not None and self.environments is not None:
            raise ValueError("set environment or environments, not both")
        if self.tools is not None and (self.environment is not None or self.environments is not None):
            raise ValueError(
                "set tools or environment(s), not both: to combine them, list the functions in the reward "
                "service's environments.functions settings and name that environment in environments"
            )
        if self.max_tool_calling_iterations is not None and self.max_turns is not None:
            raise ValueError("set max_tool_calling_iterations or max_turns, not both")
        return self

    @property
    def episode_environments(self) -> list[EnvironmentSpec]:
        """The environments of a tool-using run ([] = single-turn generation)."""
        if self.tools is not None:
            return [EnvironmentSpec(name=TOOLS_ENVIRONMENT)]
        if self.environment is not None:
            return [self.environment]
        return list(self.environments or [])

    @property
    def episode_max_turns(self) -> int | None:
        if self.max_tool_calling_iterations is not None:
            return self.max_tool_calling_iterations + 1
        return self.max_turns

    @property
    def reward_terms(self) -> list[RewardTerm]:
        """The reward functions and weights this run scores with (``prm_reward`` replaces ``reward_fn``)."""
        if self.prm_reward is not None:
            params = {"aggregate": self.prm_aggregate, **self.reward_params.get(self.prm_reward, {})}
            return [RewardTerm(name=f"prm:{self.prm_reward}", weight=1.0, params=params)]
        return [
            RewardTerm(name=name, weight=weight, params=self.reward_params.get(name, {}))
            for name, weight in parse_reward_fn(self.reward_fn)
        ]


def _rollout_target(text: str) -> str:
    parse_target(text)
    return text


# One services.rollout entry: HOST:PORT, [IPV6]:PORT, dns:///NAME:PORT or another gRPC URI (unix:PATH).
RolloutTargetText = Annotated[str, AfterValidator(_rollout_target)]


class ServicesConfig(_Strict):
    """Addresses of the reward and rollout services; unset = spawn local ones on free loopback ports.

    ``rollout``: one address or a YAML list of them, each ``HOST:PORT`` (one replica) or ``dns:///NAME:PORT``
    (every address the name resolves to, resolved again at every step: a Kubernetes headless Service); read
    as a list. Every replica gets every weight version and a share of each generation
    (:mod:`trainer_service.rollout.replicas`). Unset: one local rollout process.
    """

    reward: str | None = None
    rollout: list[RolloutTargetText] | None = Field(default=None, min_length=1)
    # Environment service of tool episodes; None = the reward service. A locally spawned rollout service is
    # configured to dial it; a remote one dials only its own configured targets, named by environment_target.
    environment: RolloutTargetText | None = None
    environment_target: str = ""
    admin_token: str | None = None
    admin_token_file: str | None = None
    tls_ca_file: str | None = None
    # Engine and model of a locally spawned rollout service (model None = the config's base).
    rollout_engine: Literal["hf", "vllm"] = "hf"
    rollout_model: str | None = None
    # Seconds to wait for a spawned service to report SERVING.
    startup_timeout_s: float = Field(default=180.0, gt=0)
    # Deadline of one Generate / Score call, seconds.
    request_timeout_s: float = Field(default=300.0, gt=0)
    # How long a step keeps retrying (with backoff) while the rollout service is down, seconds.
    retry_timeout_s: float = Field(default=300.0, ge=0)

    @field_validator("rollout", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        """One address is a list of one (checked here, so its error names ``services.rollout``)."""
        if isinstance(value, str):
            return [_rollout_target(value)]
        if value is not None and not isinstance(value, list):
            raise ValueError("must be an address (HOST:PORT or dns:///NAME:PORT) or a list of addresses")
        return value

    @field_validator("rollout")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            for index, text in enumerate(value):
                if text in value[:index]:
                    raise ValueError(f"lists {text!r} twice (entries {value.index(text)} and {index})")
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> ServicesConfig:
        if self.admin_token is not None and self.admin_token_file is not None:
            raise ValueError("set admin_token or admin_token_file, not both")
        return self

    def resolved_admin_token(self) -> str | None:
        """The admin token from the config, its file, or None."""
        if self.admin_token_file is not None:
            return Path(self.admin_token_file).read_text().strip()
        return self.admin_token


class RunConfig(_Strict):
    """A whole training run."""

    base: str
    output: str = "runs"
    experiment_name: str | None = None
    data: DataConfig
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    services: ServicesConfig = Field(default_factory=ServicesConfig)

    @property
    def output_dir(self) -> Path:
        """``output/experiment_name`` (or ``output`` alone): metrics.jsonl, checkpoints, adapter, curve."""
        out = Path(self.output)
        return out / self.experiment_name if self.experiment_name else out

    @property
    def max_completion_length(self) -> int:
        return self.training.max_completion_length or self.data.max_length


def parse_reward_fn(spec: str) -> list[tuple[str, float]]:
    """Parse ``"accuracy,format"`` or ``"accuracy:2.0,format:0.5"`` into ``[(name, weight), ...]``.

    A trailing ``:number`` is the weight (default 1.0); other colons belong to the name, so ``prm:math`` is a
    name and ``prm:math:0.5`` is that name with weight 0.5. Names must be unique and the weights finite.
    """
    terms: list[tuple[str, float]] = []
    for index, raw in enumerate(spec.split(",")):
        part = raw.strip()
        if not part:
            raise ValueError(f"entry {index} is empty (expected 'name' or 'name:weight')")
        name, weight = part, 1.0
        head, sep, tail = part.rpartition(":")
        if sep:
            try:
                weight = float(tail)
            except ValueError:
                pass  # not a number: the colon is part of the name (prm:NAME)
            else:
                name = head.strip()
                if not name:
                    raise ValueError(f"entry {index} {part!r} has a weight but no reward name")
                if not math.isfinite(weight) or abs(weight) > MAX_REWARD_WEIGHT:
                    raise ValueError(
                        f"entry {index} {part!r} needs a finite weight of magnitude <= {MAX_REWARD_WEIGHT:g}"
                    )
        if name in {existing for existing, _ in terms}:
            raise ValueError(f"reward {name!r} is listed twice")
        terms.append((name, weight))
    return terms


def _check_cross_fields(config: RunConfig) -> None:
    """Rules that span several keys; each error names the key to change."""
    t = config.training
    generation_batch = 0 if t.batch_size == "auto" else t.batch_size * t.gradient_accumulation_steps
    if generation_batch % t.num_generations:
        # TRL: generation_batch_size = batch_size × processes × GA must be divisible by G.
        raise ConfigError(
            f"batch_size × gradient_accumulation_steps = {generation_batch} must be a multiple of "
            f"training.num_generations ({t.num_generations}); the batch counts completions, not prompts",
            key="training.batch_size",
        )
    _check_objective(config)
    try:
        validate_variant_params(
            t.grpo_variant,
            grpo_delta=t.grpo_delta,
            epsilon=t.grpo_epsilon,
            epsilon_high=t.grpo_epsilon_high,
            params=t.variant_params,
        )
    except ConfigError as exc:
        raise ConfigError(str(exc).removeprefix(f"{exc.key}: "), key=f"training.{exc.key}") from exc
    if config.data.max_prompt_length is not None and config.data.max_prompt_length >= config.data.max_length:
        raise ConfigError(
            f"must be < data.max_length ({config.data.max_length})", key="data.max_prompt_length"
        )
    _check_guards(config)
    if t.eval_steps and config.data.eval is None:
        raise ConfigError("needs a held-out split in data.eval to evaluate on", key="training.eval_steps")
    if not t.eval_steps and t.num_generations_eval is not None:
        raise ConfigError(
            "is set but training.eval_steps is 0 (no evaluation runs)", key="training.num_generations_eval"
        )
    if t.vllm_sleep_mode and t.async_rollout:
        raise ConfigError(
            "cannot be combined with training.async_rollout: a sleeping engine cannot generate during the "
            "optimizer step",
            key="training.vllm_sleep_mode",
        )


def local_reward_settings(config: RunConfig) -> dict[str, Any] | None:
    """Settings of the reward service spawned for ``config``: the allow-list of training.tools, if any."""
    if not config.training.tools:
        return None
    return {"environments": {"functions": {TOOLS_ENVIRONMENT: list(config.training.tools)}}}


def _check_objective(config: RunConfig) -> None:
    """A variant's paper clip range when no ε is set, and adapters the rollout service cannot load."""
    t = config.training
    try:
        variant = normalize_variant(t.grpo_variant)
    except ConfigError as exc:
        raise ConfigError(str(exc).removeprefix(f"{exc.key}: "), key=f"training.{exc.key}") from exc
    if variant in PAPER_CLIP_RANGES and not {"grpo_epsilon", "grpo_epsilon_high"} & t.model_fields_set:
        t.grpo_epsilon, t.grpo_epsilon_high = PAPER_CLIP_RANGES[variant]
    if t.lora.use_dora and t.lora.r > 0 and t.weight_sync:
        raise ConfigError(
            "the rollout service loads LoRA adapters only (it would sample without DoRA's magnitude vectors, "
            "from other weights than the trainer trains); set it false (or training.weight_sync: false)",
            key="training.lora.use_dora",
        )


def _check_guards(config: RunConfig) -> None:
    t = config.training
    if t.guards is None:
        return
    if t.logging_steps != 1:
        raise ConfigError(
            "must be 1 with training.guards (they judge every step)", key="training.logging_steps"
        )
    for name, action in t.guards.actions().items():
        if action == "rollback" and not t.save_steps:
            raise ConfigError(
                "is rollback, which restores a checkpoint: set training.save_steps > 0",
                key=f"training.guards.{name}.action",
            )
    if t.guards.eval_gate is not None and not t.eval_steps:
        raise ConfigError(
            "needs training.eval_steps > 0 (it judges evaluations)", key="training.guards.eval_gate"
        )
    if t.guards.rollback.beta_factor != 1.0 and t.grpo_beta == 0.0:
        raise ConfigError(
            "cannot raise β from training.grpo_beta 0 (no reference model is loaded)",
            key="training.guards.rollback.beta_factor",
        )


def parse_config(source: str | dict[str, Any]) -> RunConfig:
    """Validate a config from YAML text or a dict; raise ConfigError naming the dotted key.

    YAML text is parsed within :data:`grpo_runtime.config.DEFAULT_YAML_LIMITS` (size, depth, aliases); a
    server parses it off its event loop first (``safe_load_yaml_async``) and passes the dict.
    """
    if isinstance(source, str):
        try:
            raw: Any = safe_load_yaml(source, what="config")
        except ConfigError as exc:
            raise ConfigError(str(exc).removeprefix("config: ")) from exc
    else:
        raw = source
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping of keys to values")
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as exc:
        errors = validation_errors(exc)
        key, message = errors[0]
        more = len(errors) - 1
        suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        raise ConfigError(message + suffix, key=key) from exc
    _check_cross_fields(config)
    return config


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML config file (see :func:`parse_config`)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} does not exist")
    return parse_config(file.read_text())
