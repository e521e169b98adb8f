"""Training-run configuration: the YAML a user writes, validated with pydantic.

``training:`` is grouped by concern with TRL's key names (:mod:`trainer_service.config.training`); ``data``
says where prompts come from, ``services`` where the reward and rollout services are. Every model forbids
unknown keys, every float is finite (:mod:`trainer_service.config.fields`), and every error names the dotted
key it is about (``training.model.lora.r: ...``). :func:`parse_config` reports every error at once: old keys
(with their new place, :mod:`trainer_service.config.retired_keys`), unknown keys (with the nearest valid
one), bad values, and the rules that span keys. The reference of every key is docs/config.md, generated from
these models by ``scripts/gen_config_docs.py``.

Example::

    base: tests/assets/models/policy
    output: runs
    experiment_name: demo
    data: {train: data/train.jsonl, max_prompt_length: 128}
    training:
      max_steps: 50
      optimizer: {learning_rate: 1.0e-5, per_device_train_batch_size: 8}  # completions, as TRL counts
      generation: {num_generations: 4, max_completion_length: 256}
      rewards: {reward_fn: "accuracy:1.0,format:0.2"}
      model: {lora: {r: 8, alpha: 16}}
    services: {reward: 127.0.0.1:50051, rollout: 127.0.0.1:50052}
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

# A config that cannot run raises the runtime's ConfigError naming the dotted key
# (``training.optimizer.learning_rate: must be > 0``), so whatever handles a service's config error handles a
# run config's too.
from grpo_runtime.config import ConfigError, safe_load_yaml, validation_errors
from grpo_runtime.images import ImageLimits
from trainer_service.config.agents import HOST_PLACEHOLDER
from trainer_service.config.fields import FiniteParams, StrictModel
from trainer_service.config.key_paths import nearest_key
from trainer_service.config.retired_keys import without_retired_keys
from trainer_service.config.rollout_targets import TargetList, TargetText, parse_target
from trainer_service.config.tools import TOOLS_ENVIRONMENT
from trainer_service.config.training import TrainingConfig
from trainer_service.config.variants import PAPER_CLIP_RANGES, normalize_variant, validate_variant_params

# A data source that generates its rows instead of reading a file: ``reasoning_gym:<task>``.
GENERATED_PREFIX = "reasoning_gym:"

# The variant catalog names its keys as the loss block does, without the block's path.
LOSS_KEY_PREFIX = "training.loss."


def generated_task(source: str | None) -> str | None:
    """The reasoning-gym task of a ``data.train``/``data.eval`` value, None when it names a file."""
    if source is not None and source.startswith(GENERATED_PREFIX):
        return source[len(GENERATED_PREFIX) :]
    return None


class GeneratedData(StrictModel):
    """Rows of a ``reasoning_gym:<task>`` source. reasoning-gym draws entry ``i`` from ``Random(seed + i)``,
    so the eval rows (from ``seed + size``) are other draws than the train rows. Loading the data refuses a
    task the reward service withholds and a ``config`` value past its bound
    (``trainer_service.training.data.generate_rows``)."""

    size: int = Field(default=1000, ge=1, le=1_000_000, description="Train rows generated.")
    eval_size: int = Field(default=100, ge=1, le=100_000, description="Eval rows generated.")
    seed: int = Field(
        default=0, ge=0, le=2**31 - 1, description="Seed of the train rows (eval: seed + size)."
    )
    config: FiniteParams = Field(
        default_factory=dict, description="The task's config: fields of its config dataclass."
    )
    system_prompt: str | None = Field(
        default="default",
        description="System message from reasoning-gym's SYSTEM_PROMPTS[system_prompt]; None = no system "
        "message.",
    )


class DataConfig(StrictModel):
    """Where prompts come from and how long they may be."""

    train: str = Field(
        description="Train rows: a local JSONL, JSON or Parquet file, a directory written by "
        "datasets.Dataset.save_to_disk (a DatasetDict directory gives its train split), or "
        "'reasoning_gym:<task>' (rows generated as data.reasoning_gym says)."
    )
    eval: str | None = Field(
        default=None, description="Held-out rows, in the same forms as train (a DatasetDict: its test split)."
    )
    reasoning_gym: GeneratedData = Field(default_factory=GeneratedData, description=GeneratedData.__doc__)
    format: Literal["auto", "messages", "prompt", "dpo", "alpaca"] = Field(
        default="auto", description="Row layout: 'auto' detects per row; the others force one of soup-cli's."
    )
    max_prompt_length: int | None = Field(
        default=None,
        ge=1,
        description="Prompts longer than this many tokens are rejected by the data check; None = no limit.",
    )
    images: ImageLimits = Field(
        default_factory=ImageLimits,
        description="Limits on a vision row's images (its 'image' or 'images' column), checked as each is "
        "loaded: count per row, encoded bytes and decoded pixels of each.",
    )


class ServicesConfig(StrictModel):
    """Addresses of the reward and rollout services; unset = spawn local ones on free loopback ports."""

    reward: str | None = Field(
        default=None, description="Reward service HOST:PORT; None = spawn one locally."
    )
    rollout: TargetList = Field(
        default=None,
        min_length=1,
        description="One address or a list, each HOST:PORT (one replica) or dns:///NAME:PORT (every address "
        "the name resolves to, resolved again at every step: a Kubernetes headless Service). Every replica "
        "gets every weight version and a share of each generation (trainer_service.rollout.replicas). "
        "None = one local rollout process.",
    )
    environment: TargetText | None = Field(
        default=None,
        description="Environment service of tool episodes; None = the reward service. A locally spawned "
        "rollout service is configured to dial it; a remote one dials only its own configured targets, "
        "named by environment_target.",
    )
    environment_target: str = Field(
        default="", description="Name of the remote rollout service's environment target to use."
    )
    admin_token: str | None = Field(default=None, description="Bearer token of the services' admin RPCs.")
    admin_token_file: str | None = Field(
        default=None, description="File whose stripped contents are the token."
    )
    tls_ca_file: str | None = Field(
        default=None, description="PEM CA bundle to verify the services' TLS certificates; None = plaintext."
    )
    rollout_engine: Literal["hf", "vllm"] = Field(
        default="hf", description="Engine of a locally spawned rollout service."
    )
    rollout_model: str | None = Field(
        default=None, description="Model of a locally spawned rollout service; None = the config's base."
    )
    startup_timeout_s: float = Field(
        default=180.0, gt=0, description="Seconds to wait for a spawned service to report SERVING."
    )
    request_timeout_s: float = Field(
        default=300.0, gt=0, description="Deadline of one Generate / Score call, seconds."
    )
    retry_timeout_s: float = Field(
        default=300.0,
        ge=0,
        description="How long a step keeps retrying (with backoff) while the rollout service is down, "
        "seconds.",
    )

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


class RunConfig(StrictModel):
    """A whole training run."""

    base: str = Field(description="The policy to train: a local model directory (or hub id where allowed).")
    output: str = Field(default="runs", description="Directory the run writes under.")
    experiment_name: str | None = Field(
        default=None, description="Subdirectory of output for this run; None = output itself."
    )
    data: DataConfig = Field(description=DataConfig.__doc__)
    training: TrainingConfig = Field(default_factory=TrainingConfig, description=TrainingConfig.__doc__)
    services: ServicesConfig = Field(default_factory=ServicesConfig, description=ServicesConfig.__doc__)

    @property
    def output_dir(self) -> Path:
        """``output/experiment_name`` (or ``output`` alone): metrics.jsonl, checkpoints, adapter, curve."""
        out = Path(self.output)
        return out / self.experiment_name if self.experiment_name else out


Problems = Iterator[tuple[str, str]]


def _cross_field_errors(config: RunConfig) -> Problems:
    """Rules that span several keys; each ``(key, message)`` names the key to change."""
    t = config.training
    batch = t.optimizer.per_device_train_batch_size
    generation_batch = 0 if batch == "auto" else batch * t.optimizer.gradient_accumulation_steps
    if generation_batch % t.generation.num_generations:
        # TRL: generation_batch_size = batch_size × processes × GA must be divisible by G.
        yield (
            "training.optimizer.per_device_train_batch_size",
            f"per_device_train_batch_size × gradient_accumulation_steps = {generation_batch} must be a "
            f"multiple of training.generation.num_generations ({t.generation.num_generations}); the batch "
            "counts completions, not prompts",
        )
    yield from _objective_errors(config)
    yield from _guard_errors(config)
    yield from _agent_errors(config)
    evaluation = t.evaluation
    if evaluation.eval_steps and config.data.eval is None:
        yield "training.evaluation.eval_steps", "needs a held-out split in data.eval to evaluate on"
    if not evaluation.eval_steps and evaluation.num_generations_eval is not None:
        yield (
            "training.evaluation.num_generations_eval",
            "is set but training.evaluation.eval_steps is 0 (no evaluation runs)",
        )
    if t.rollout.vllm_enable_sleep_mode and t.rollout.async_rollout:
        yield (
            "training.rollout.vllm_enable_sleep_mode",
            "cannot be combined with training.rollout.async_rollout: a sleeping engine cannot generate "
            "during the optimizer step",
        )
    if t.loss.importance_sampling == "off" and t.rollout.async_rollout:
        yield (
            "training.loss.importance_sampling",
            "cannot be 'off' with training.rollout.async_rollout: async batches come from older weights and "
            "only the correction makes training on them unbiased (use auto or on)",
        )


def _objective_errors(config: RunConfig) -> Problems:
    """The variant and its parameters; a variant's paper clip range when no ε is set; adapters the rollout
    service cannot load."""
    loss = config.training.loss
    try:
        variant = normalize_variant(loss.variant)
        validate_variant_params(
            loss.variant,
            grpo_delta=loss.delta,
            epsilon=loss.epsilon,
            epsilon_high=loss.epsilon_high,
            params=loss.params,
        )
    except ConfigError as exc:
        yield f"{LOSS_KEY_PREFIX}{exc.key}", str(exc).removeprefix(f"{exc.key}: ")
    else:
        if variant in PAPER_CLIP_RANGES and not {"epsilon", "epsilon_high"} & loss.model_fields_set:
            loss.epsilon, loss.epsilon_high = PAPER_CLIP_RANGES[variant]
    lora = config.training.model.lora
    if lora.use_dora and lora.r > 0 and config.training.rollout.weight_sync:
        yield (
            "training.model.lora.use_dora",
            "the rollout service loads LoRA adapters only (it would sample without DoRA's magnitude vectors, "
            "from other weights than the trainer trains); set it false (or training.rollout.weight_sync: "
            "false)",
        )


def _agent_errors(config: RunConfig) -> Problems:
    """Agent episodes need the gateway of each rollout replica, as the agent reaches it, and no tool
    episodes."""
    if config.training.agents is None:
        return
    if config.training.tools.episode_environments:
        yield "training.agents", "cannot be combined with training.tools (the agent runs its own tools)"
    rollout = config.services.rollout
    gateway_url = config.training.agents.gateway_url
    targets = [parse_target(t) for t in rollout or []]
    several = len(targets) > 1 or any(t.dynamic for t in targets)
    hostless = next((t.text for t in targets if not t.has_host), None)
    if hostless is not None and (gateway_url is None or HOST_PLACEHOLDER in gateway_url):
        yield (
            "training.agents.gateway_url",
            f"must name the gateway's http(s)://HOST:PORT: the rollout replica {hostless!r} has no host "
            "the agent could reach its gateway at",
        )
    if several and gateway_url is not None and HOST_PLACEHOLDER not in gateway_url:
        yield (
            "training.agents.gateway_url",
            f"must hold {HOST_PLACEHOLDER} with several rollout replicas (each episode's session lives on "
            f"one replica; the agent must dial that replica's gateway, e.g. http://{HOST_PLACEHOLDER}:8000)",
        )
    if rollout is None and config.training.agents.gateway_url is not None:
        yield (
            "training.agents.gateway_url",
            "names the gateway of services.rollout, which is unset: the rollout service this run starts "
            "serves its own gateway (unset gateway_url)",
        )


def _guard_errors(config: RunConfig) -> Problems:
    t = config.training
    if t.guards is None:
        return
    if t.logging_steps != 1:
        yield "training.logging_steps", "must be 1 with training.guards (they judge every step)"
    for name, action in t.guards.actions().items():
        if action == "rollback" and not t.save_steps:
            yield (
                f"training.guards.{name}.action",
                "is rollback, which restores a checkpoint: set training.save_steps > 0",
            )
    if t.guards.eval_gate is not None and not t.evaluation.eval_steps:
        yield "training.guards.eval_gate", "needs training.evaluation.eval_steps > 0 (it judges evaluations)"
    if t.guards.rollback.beta_factor != 1.0 and t.loss.beta == 0.0:
        yield (
            "training.guards.rollback.beta_factor",
            "cannot raise β from training.loss.beta 0 (no reference model is loaded)",
        )


def local_reward_settings(config: RunConfig) -> dict[str, Any] | None:
    """Settings of the reward service spawned for ``config``: the allow-list of training.tools.functions."""
    functions = config.training.tools.functions
    if not functions:
        return None
    return {"environments": {"functions": {TOOLS_ENVIRONMENT: list(functions)}}}


def _with_suggestion(key: str, message: str) -> tuple[str, str]:
    """An unknown key's message with the nearest valid key, when one is close."""
    if message != "unknown key":
        return key, message
    nearest = nearest_key(key, RunConfig)
    return key, f"{message}; did you mean {nearest}?" if nearest else message


def parse_config(source: str | dict[str, Any]) -> RunConfig:
    """Validate a config from YAML text or a dict; raise one ConfigError listing every error found.

    Old keys, unknown keys and bad values are all reported; the rules that span keys are checked once every
    key is valid. YAML text is parsed within :data:`grpo_runtime.config.DEFAULT_YAML_LIMITS` (size, depth,
    aliases); a server parses it off its event loop first (``safe_load_yaml_async``) and passes the dict.
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
    cleaned, errors = without_retired_keys(raw)
    try:
        config = RunConfig.model_validate(cleaned)
    except ValidationError as exc:
        errors += [_with_suggestion(key, message) for key, message in validation_errors(exc)]
        raise ConfigError.collected(errors) from exc
    if not errors:
        # Only with every key in its place: a moved key's value is unknown here, so a rule could misjudge.
        errors = list(_cross_field_errors(config))
    if errors:
        raise ConfigError.collected(errors)
    return config


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML config file (see :func:`parse_config`)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} does not exist")
    return parse_config(file.read_text())
