"""What a run started over gRPC may touch: the service's configured roots and allow-lists.

A StartRun caller may be hostile, so every path and every importable name in its config is checked before a
worker starts:

- ``output`` / ``experiment_name``: no ``..`` component, ``experiment_name`` relative, and the output
  directory, symlinks resolved, inside ``runs_root`` and a directory if it exists (never a device file);
- ``training.resume_from_checkpoint`` (a path): inside ``runs_root`` too;
- ``data.train``, ``data.eval`` (unless a generated ``reasoning_gym:<task>`` source), a
  ``training.model.deepspeed`` file: inside one of ``data_roots``, a regular file or a directory if it exists
  (a missing file fails the run itself, with the data error); an inline DeepSpeed config is refused (it can
  name directories DeepSpeed writes, such as an offload ``nvme_path``);
- ``training.guards.eval_gate.baseline_file``: a regular file inside ``runs_root`` or one of ``data_roots``;
- ``base``, ``services.rollout_model``: a directory inside one of ``model_roots``, or, when the value names no
  existing path, a hub id (``NAME`` or ``ORG/NAME``);
- ``services.admin_token_file``, ``services.tls_ca_file``: regular files inside one of ``secret_roots``;
- a ``unix:PATH`` service address (``services.reward``, ``services.rollout[i]``, ``services.environment``,
  ``training.agents.target``): inside one of ``socket_roots``;
- ``training.tools.functions[i]`` (``module:function``, imported by the reward service a run starts):
  listed in ``allowed_tools``; ``training.report_to`` (each integration imports its package): listed in
  ``allowed_report_to`` or ``none``; ``training.agents.command``: refused (a service runs no caller's
  command).

Relative paths are relative to the service's working directory, as the worker reads them. The CLI's ``train``
runs as the user on the user's own files and code and does not go through here.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from grpo_runtime.errors import InvalidArgument
from grpo_runtime.paths import is_within, resolve_path
from trainer_service.config.run_config import RunConfig, generated_task
from trainer_service.settings import TrainerServiceSettings


@dataclass(frozen=True)
class RunRoots:
    """The resolved directories runs may use (see the module docstring)."""

    runs: Path
    data: tuple[Path, ...]
    secrets: tuple[Path, ...]
    models: tuple[Path, ...] = ()
    sockets: tuple[Path, ...] = ()

    @classmethod
    def of(cls, settings: TrainerServiceSettings) -> RunRoots:
        return cls(
            runs=settings.runs_root.resolve(),
            data=_resolved(settings.data_roots),
            secrets=_resolved(settings.secret_roots),
            models=_resolved(settings.model_roots),
            sockets=_resolved(settings.socket_roots),
        )


@dataclass(frozen=True)
class RunAllowList:
    """The importable names runs may use (see the module docstring); empty refuses every one."""

    tools: frozenset[str] = field(default_factory=frozenset)
    report_to: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, settings: TrainerServiceSettings) -> RunAllowList:
        return cls(tools=frozenset(settings.allowed_tools), report_to=frozenset(settings.allowed_report_to))


def _resolved(roots: list[Path]) -> tuple[Path, ...]:
    return tuple(root.resolve() for root in roots)


def _refused(key: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{key}: {message}", field="config_yaml")


def _resolve(text: str, key: str) -> Path:
    """``text`` as an absolute path with every symlink resolved."""
    try:
        return resolve_path(text)
    except ValueError as exc:
        raise _refused(key, str(exc)) from exc


def _inside(path: Path, roots: tuple[Path, ...], key: str, what: str) -> None:
    if not is_within(path, roots):
        listed = ", ".join(str(root) for root in roots) or "(none configured)"
        raise _refused(key, f"{path} is outside the allowed {what} ({listed})")


def _kind(path: Path, key: str, *, directory_ok: bool, file_ok: bool) -> None:
    """Refuse an existing path that is not of an allowed kind (FIFOs, sockets and devices never are)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _refused(key, f"cannot be read: {exc.strerror or exc}") from exc
    if (directory_ok and stat.S_ISDIR(mode)) or (file_ok and stat.S_ISREG(mode)):
        return
    wanted = " or ".join(k for k, ok in (("a directory", directory_ok), ("a regular file", file_ok)) if ok)
    raise _refused(key, f"{path} must be {wanted}")


def _no_parent_steps(text: str, key: str) -> None:
    if ".." in Path(text).parts:
        raise _refused(key, "must not contain '..'")


def confine(config: RunConfig, roots: RunRoots, allowed: RunAllowList | None = None) -> Path:
    """Check every path and importable name of ``config`` against ``roots`` and ``allowed`` (None: nothing
    is allowed); returns the resolved output directory.

    Raises InvalidArgument (``config_yaml: <key>: ...``) naming the first key that breaks a rule.
    """
    output_dir = _output_dir(config, roots)
    _reads(config, roots)
    _models(config, roots)
    _secrets(config, roots)
    _sockets(config, roots)
    _imports(config, allowed or RunAllowList())
    return output_dir


def _output_dir(config: RunConfig, roots: RunRoots) -> Path:
    _no_parent_steps(config.output, "output")
    name = config.experiment_name
    if name is not None:
        _no_parent_steps(name, "experiment_name")
        if Path(name).is_absolute():
            raise _refused("experiment_name", "must be a relative name, not an absolute path")
    output_dir = _resolve(str(config.output_dir), "output")
    _inside(output_dir, (roots.runs,), "output", "runs root")
    _kind(output_dir, "output", directory_ok=True, file_ok=False)

    checkpoint = config.training.resume_from_checkpoint
    if isinstance(checkpoint, str):
        key = "training.resume_from_checkpoint"
        path = _resolve(checkpoint, key)
        _inside(path, (roots.runs,), key, "runs root")
        _kind(path, key, directory_ok=True, file_ok=False)
    return output_dir


def _reads(config: RunConfig, roots: RunRoots) -> None:
    """Data and DeepSpeed files under the data roots; an eval baseline under the runs or data roots."""
    data_files = {"data.train": config.data.train, "data.eval": config.data.eval}
    deepspeed = config.training.model.deepspeed
    if isinstance(deepspeed, dict):
        raise _refused(
            "training.model.deepspeed",
            "an inline DeepSpeed config is refused over StartRun (it can name directories DeepSpeed writes, "
            "such as an offload nvme_path); name a DeepSpeed config file under the data roots",
        )
    if deepspeed is not None:
        data_files["training.model.deepspeed"] = deepspeed
    for key, text in data_files.items():
        if text is not None and generated_task(text) is None:  # generated data reads no file
            path = _resolve(text, key)
            _inside(path, roots.data, key, "data roots")
            _kind(path, key, directory_ok=key != "training.model.deepspeed", file_ok=True)

    guards = config.training.guards
    baseline = guards.eval_gate.baseline_file if guards and guards.eval_gate else None
    if baseline is not None:
        key = "training.guards.eval_gate.baseline_file"
        path = _resolve(baseline, key)
        _inside(path, (roots.runs, *roots.data), key, "runs and data roots")
        _kind(path, key, directory_ok=False, file_ok=True)


# A Hugging Face hub repository id, NAME or ORG/NAME: ASCII, a subset of huggingface_hub's validate_repo_id.
_HUB_NAME = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"{_HUB_NAME}(?:/{_HUB_NAME})?", re.ASCII)
_HUB_ID_MAX_CHARS = 96


def _is_hub_id(text: str) -> bool:
    return (
        len(text) <= _HUB_ID_MAX_CHARS
        and _HUB_ID.fullmatch(text) is not None
        and ".." not in text
        and "--" not in text
    )


def _models(config: RunConfig, roots: RunRoots) -> None:
    """``base`` and ``services.rollout_model``: a directory under the model roots, or a hub id.

    transformers (and a rollout service the run starts, in the same working directory) reads a value that
    names an existing directory from disk and any other as a hub id, so only a value that names no existing
    path may pass as a hub id."""
    models = {"base": config.base, "services.rollout_model": config.services.rollout_model}
    for key, text in models.items():
        if text is None:
            continue
        path = _resolve(text, key)
        if _is_hub_id(text) and not _exists(Path(text), key):
            continue
        _inside(path, roots.models, key, "model roots")
        _kind(path, key, directory_ok=True, file_ok=False)


def _exists(path: Path, key: str) -> bool:
    """Whether ``path`` exists, a dangling symlink included."""
    try:
        path.lstat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _refused(key, f"cannot be read: {exc.strerror or exc}") from exc
    return True


def _secrets(config: RunConfig, roots: RunRoots) -> None:
    secret_files = {
        "services.admin_token_file": config.services.admin_token_file,
        "services.tls_ca_file": config.services.tls_ca_file,
    }
    for key, text in secret_files.items():
        if text is not None:
            path = _resolve(text, key)
            _inside(path, roots.secrets, key, "secret roots")
            if not path.is_file():
                raise _refused(key, f"{path} is not a regular file")


def unix_socket_path(target: str) -> str | None:
    """The socket path of a gRPC ``unix:PATH`` or ``unix:///ABSOLUTE`` address; None for other schemes."""
    if not target.startswith("unix:"):
        return None
    path = target.removeprefix("unix:")
    return path.removeprefix("//") if path.startswith("///") else path


def _sockets(config: RunConfig, roots: RunRoots) -> None:
    """Service addresses that are unix sockets: only under the socket roots."""
    s = config.services
    addresses = {"services.reward": s.reward, "services.environment": s.environment}
    addresses |= {f"services.rollout[{index}]": target for index, target in enumerate(s.rollout or [])}
    agents = config.training.agents.target if config.training.agents is not None else None
    addresses |= {f"training.agents.target[{index}]": target for index, target in enumerate(agents or [])}
    for key, target in addresses.items():
        socket = unix_socket_path(target) if target is not None else None
        if socket is not None:
            _inside(_resolve(socket, key), roots.sockets, key, "socket roots")


def _imports(config: RunConfig, allowed: RunAllowList) -> None:
    """Names a run's processes would import or run: function tools, reporting integrations, and an agent
    command (never: only the command line starts one)."""
    t = config.training
    if t.agents is not None and t.agents.command is not None:
        raise _refused(
            "training.agents.command",
            "a trainer service runs no command a caller names; start the agent yourself and set "
            "training.agents.target",
        )
    for index, tool in enumerate(t.tools.functions or []):
        if tool not in allowed.tools:
            raise _refused(
                f"training.tools.functions[{index}]",
                f"{tool!r} is not in the trainer service's allowed_tools ({_listed(allowed.tools)}); a run "
                "may only name functions the operator allow-listed",
            )
    integrations = [t.report_to] if isinstance(t.report_to, str) else t.report_to
    for index, name in enumerate(integrations):
        if name != "none" and name not in allowed.report_to:
            key = "training.report_to" if isinstance(t.report_to, str) else f"training.report_to[{index}]"
            raise _refused(
                key,
                f"{name!r} is not in the trainer service's allowed_report_to "
                f"({_listed(allowed.report_to)}); 'none' is always allowed",
            )


def _listed(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "none configured"
