"""Settings of the tool environments (the ``environments:`` block of the reward service config)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# `module.path:ClassName`, the form `python -m`-style entry points use.
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
NAME = re.compile(r"^[A-Za-z][\w.-]{0,63}$")


class CalculatorSettings(BaseModel):
    """Bounds of one ``calculator`` expression (the AST walker refuses anything past them)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Offer the `calculator` environment.")
    max_expression_chars: int = Field(1000, ge=1, description="Longest expression accepted.")
    max_nodes: int = Field(200, ge=1, description="Most syntax-tree nodes of one expression.")
    max_exponent: int = Field(1000, ge=1, description="Largest |exponent| of `**`.")
    max_result_digits: int = Field(
        1000, ge=1, description="Most decimal digits of any integer the evaluation produces."
    )


class PythonSettings(BaseModel):
    """The ``python`` environment: each call runs in the code sandbox (the ``sandbox:`` block's limits)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Offer the `python` environment (needs the sandbox).")
    max_cells: int = Field(
        32,
        ge=1,
        description="Code cells one episode may run. State is rebuilt by replaying earlier cells, so CPU "
        "grows with the count.",
    )


class McpServerSettings(BaseModel):
    """An MCP server started over stdio, one process per episode."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="Executable of the server.")
    args: list[str] = Field(default_factory=list, description="Its command-line arguments.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables of the server, over the MCP SDK's safe defaults (PATH, HOME, "
        "...); the service's own environment, secrets included, is not inherited.",
    )
    cwd: str | None = Field(None, description="Working directory of the server.")
    description: str = Field("", description="Shown by ListEnvironments.")
    max_episodes: int = Field(
        16,
        ge=1,
        description="Episodes of this server open at once (each is a process); more is RESOURCE_EXHAUSTED.",
    )


class EnvironmentSettings(BaseModel):
    """Episode limits plus the environments offered. Times in seconds."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Serve grpo.env.v1.EnvironmentService.")
    max_open_episodes: int = Field(
        256, ge=1, description="Episodes open at once; OpenEpisode past it is RESOURCE_EXHAUSTED."
    )
    idle_timeout_s: float = Field(
        600.0, gt=0, description="An episode with no call for this long is closed by the server."
    )
    tool_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest one tool call may take; past it the call is an error result and the episode "
        "is done (a hung tool may still hold its state).",
    )
    open_timeout_s: float = Field(
        60.0, gt=0, description="Longest opening an episode (constructor, reset, server start) may take."
    )
    max_calls_per_step: int = Field(
        32, ge=1, description="Tool calls in one Step; more is RESOURCE_EXHAUSTED."
    )
    max_arguments_chars: int = Field(
        65536, ge=16, description="Longest `arguments_json` run; longer is an error result."
    )
    max_result_chars: int = Field(
        16384, ge=64, description="Tool output kept in a result; the rest is cut (`truncated`)."
    )
    max_metadata_chars: int = Field(
        1 << 20,
        ge=1,
        description="Characters of an episode's params and metadata together; more is INVALID_ARGUMENT.",
    )
    trl_threads: int = Field(
        8,
        ge=1,
        description="Threads running TRL environment methods (sync Python; a hung one holds its thread).",
    )
    calculator: CalculatorSettings = Field(default_factory=CalculatorSettings)
    python: PythonSettings = Field(default_factory=PythonSettings)
    trl: dict[str, str] = Field(
        default_factory=dict,
        description="TRL environment classes offered, name -> 'module:Class'. Only from this file: "
        "importing a class runs its module's code with the service's rights.",
    )
    functions: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Environments whose tools are plain functions (TRL's `tools=`), name -> "
        "['module:function', ...]. Only from this file, like `trl`.",
    )
    mcp: dict[str, McpServerSettings] = Field(
        default_factory=dict, description="MCP servers offered as environments, name -> how to start it."
    )

    @field_validator("trl")
    @classmethod
    def _import_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not IMPORT_PATH.match(path):
                raise ValueError(f"{name}: {path!r} is not 'module:Class'")
        return value

    @field_validator("functions")
    @classmethod
    def _function_paths(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, paths in value.items():
            if not paths:
                raise ValueError(f"{name}: lists no function")
            for path in paths:
                if not IMPORT_PATH.match(path):
                    raise ValueError(f"{name}: {path!r} is not 'module:function'")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> EnvironmentSettings:
        seen = {"calculator", "python"}
        for name in [*self.trl, *self.functions, *self.mcp]:
            if not NAME.match(name):
                raise ValueError(f"environment name {name!r}: letters, digits, '_', '.', '-' (at most 64)")
            if name in seen:
                raise ValueError(
                    f"environment name {name!r} is used twice (calculator and python are built in)"
                )
            seen.add(name)
        return self
