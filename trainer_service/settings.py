"""Settings of the trainer service: the ``--config`` YAML minus its ``server:`` block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_runtime.config import ConfigError, format_validation_error
from trainer_service.config.tools import FunctionPath

DEFAULT_PORT = 50053


class TrainerServiceSettings(BaseModel):
    """What the service itself needs; each run brings its own config (``StartRun``)."""

    model_config = ConfigDict(extra="forbid")

    stop_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="On shutdown, seconds live runs get to reach a step boundary and checkpoint before being "
        "terminated.",
    )
    runs_root: Path = Field(
        default=Path("runs"),
        description="StartRun writes only under this directory: a run's output/experiment_name must resolve "
        "inside it (relative paths are relative to the service's working directory).",
    )
    data_roots: list[Path] = Field(
        default=[Path("data")],
        description="Directories a StartRun config may read data from (data.train, data.eval, a "
        "training.model.deepspeed file, and training.guards.eval_gate.baseline_file, which may also be "
        "under runs_root).",
    )
    model_roots: list[Path] = Field(
        default=[Path("models")],
        description="Directories a StartRun config may load a model from (base, services.rollout_model). A "
        "value that names no existing path and reads as a hub id (NAME or ORG/NAME) is a hub id instead.",
    )
    secret_roots: list[Path] = Field(
        default=[Path("/run/secrets"), Path("secrets")],
        description="Directories a StartRun config may read secrets from (services.admin_token_file, "
        "services.tls_ca_file).",
    )
    socket_roots: list[Path] = Field(
        default=[],
        description="Directories whose unix sockets a StartRun config may name as a service address "
        "(services.reward, services.rollout, services.environment as unix:PATH); none by default.",
    )
    allowed_tools: list[FunctionPath] = Field(
        default=[],
        description="The 'module:function' entries a StartRun config may list in training.tools.functions. "
        "A run that starts its own reward service makes it import them, which runs the module's top-level "
        "code with this service's rights: list only code you trust. None by default.",
    )
    allowed_report_to: list[str] = Field(
        default=[],
        description="Integrations a StartRun config may name in training.report_to ('none' always): each "
        "imports its package and may write outside runs_root or send data off the host (mlflow's ./mlruns, "
        "wandb). None by default.",
    )
    max_concurrent_runs: int = Field(
        default=4, ge=1, description="Runs training at once; StartRun beyond it is RESOURCE_EXHAUSTED."
    )


def load_settings(raw: dict[str, Any] | None) -> TrainerServiceSettings:
    """Validates the settings dict; ConfigError names the key (e.g. ``stop_grace_s: ...``)."""
    try:
        return TrainerServiceSettings.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc
