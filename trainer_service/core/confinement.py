"""Where a run started over gRPC may write and read: the service's configured roots.

A StartRun caller may be hostile, so every path in its config is checked before a worker starts:

- ``output`` / ``experiment_name``: no ``..`` component, ``experiment_name`` relative, and the output
  directory, symlinks resolved, inside ``runs_root`` and a directory if it exists (never a device file);
- ``training.resume_from_checkpoint`` (a path): inside ``runs_root`` too;
- ``data.train``, ``data.eval`` (unless a generated ``reasoning_gym:<task>`` source), a
  ``training.deepspeed_config`` file: inside one of ``data_roots``, a regular file or a directory if it exists
  (a missing file fails the run itself, with the data error);
- ``services.admin_token_file``, ``services.tls_ca_file``: regular files inside one of ``secret_roots``.

Relative paths are relative to the service's working directory, as the worker reads them. The CLI's ``train``
runs as the user on the user's own files and does not go through here.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
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

    @classmethod
    def of(cls, settings: TrainerServiceSettings) -> RunRoots:
        return cls(
            runs=settings.runs_root.resolve(),
            data=tuple(root.resolve() for root in settings.data_roots),
            secrets=tuple(root.resolve() for root in settings.secret_roots),
        )


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


def confine(config: RunConfig, roots: RunRoots) -> Path:
    """Check every path of ``config`` against ``roots``; returns the resolved output directory.

    Raises InvalidArgument (``config_yaml: <key>: ...``) naming the first key that breaks a rule.
    """
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

    data_files = {"data.train": config.data.train, "data.eval": config.data.eval}
    if isinstance(config.training.deepspeed_config, str):
        data_files["training.deepspeed_config"] = config.training.deepspeed_config
    for key, text in data_files.items():
        if text is not None and generated_task(text) is None:  # generated data reads no file
            path = _resolve(text, key)
            _inside(path, roots.data, key, "data roots")
            _kind(path, key, directory_ok=key != "training.deepspeed_config", file_ok=True)

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
    return output_dir
