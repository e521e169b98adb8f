"""Start reward and rollout services as local subprocesses on free loopback ports, and stop them.

Used by ``python -m trainer_service demo``, by ``train`` when ``services.reward``/``services.rollout`` are
unset, and by tests. Each service is the real ``python -m reward_service`` / ``python -m rollout_service``
process; it is ready when its gRPC health check reports SERVING. ``HF_HUB_OFFLINE=1`` is set so nothing is
downloaded.

A port picked here (:func:`free_port`) is free when picked but is bound seconds later, after the service has
imported torch and loaded its model; another process (a client's ephemeral port, another server) can take it
meanwhile. A service that then exits with ``EXIT_BIND_ERROR`` is started again on fresh ports, up to
``PORT_ATTEMPTS`` times; a port the caller chose is never retried.

``rollout_threads`` sizes the rollout service's torch pools (:mod:`trainer_service.rollout.cpu_placement`).
The rollout service gets a fresh directory in ``/dev/shm`` as its ``weight_shm_dir`` (where that is a
writable memory-backed directory), so the trainer on this host pushes weights through shared memory instead
of the gRPC stream; the directory is removed when the services stop.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from grpo_runtime.call_errors import ServiceCallError
from grpo_runtime.cli import EXIT_BIND_ERROR
from grpo_runtime.client import ChannelConfig, ServiceClient
from trainer_service.config.agents import PORT_PLACEHOLDER, PYTHON_PLACEHOLDER

SHARED_MEMORY_ROOT = Path("/dev/shm")
SHARED_MEMORY_PREFIX = "grpo-weight-shm-"
PORT_ATTEMPTS = 3
Started = TypeVar("Started")

logger = logging.getLogger(__name__)


class ServiceExited(RuntimeError):
    """A started service exited before its health check said SERVING."""

    def __init__(self, name: str, returncode: int):
        super().__init__(f"{name} exited with code {returncode} before it was ready")
        self.returncode = returncode

    @property
    def port_taken(self) -> bool:
        """It could not bind its port (taken between :func:`free_port` and its bind)."""
        return self.returncode == EXIT_BIND_ERROR


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; the service binds it right after)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_serving(target: str, process: subprocess.Popen | None, timeout_s: float, name: str) -> None:
    """Poll the gRPC health check of ``target`` until SERVING; raise if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    # One attempt per poll: the loop is the retry.
    with ServiceClient(ChannelConfig(target=target, retry_max_attempts=1)) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise ServiceExited(name, process.returncode)
            try:
                last = client.serving_status(timeout_s=2.0)
                if last == "SERVING":
                    return
            except ServiceCallError as error:
                last = error.code.name
            time.sleep(0.2)
    raise TimeoutError(f"{name} at {target} was not SERVING within {timeout_s:.0f} s (last: {last})")


def thread_env(threads: int | None) -> dict[str, str]:
    """Environment that sizes a child process's OpenMP/MKL pools (torch reads it at start); {} = default."""
    if threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


@dataclass
class ServiceProcess:
    """A started service: its process, address and log file."""

    name: str
    process: subprocess.Popen
    target: str
    log_path: Path | None = None

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM, wait up to ``grace_s`` (the service drains its RPCs), then SIGKILL. Returns the exit
        code.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def spawn_service(
    module: str,
    args: Sequence[str] = (),
    *,
    port: int | None = None,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> ServiceProcess:
    """Run ``python -m MODULE --host 127.0.0.1 --port P ARGS`` without waiting for it to be ready."""
    port = port or free_port()
    command = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args]
    return spawn_command(module, command, port, log_dir=log_dir, env=env)


def spawn_command(
    name: str,
    command: Sequence[str],
    port: int,
    *,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> ServiceProcess:
    """Run ``command``, a gRPC server that will listen on ``127.0.0.1:port``, logging to
    ``log_dir/NAME.log`` (nowhere without ``log_dir``); nothing is downloaded from a model hub."""
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    log_path = None
    stream: IO[bytes] | int
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        stream = log_path.open("ab")
    else:
        stream = subprocess.DEVNULL
    process = subprocess.Popen(list(command), stdout=stream, stderr=subprocess.STDOUT, env=child_env)
    return ServiceProcess(name=name, process=process, target=f"127.0.0.1:{port}", log_path=log_path)


def start_agent(
    command: Sequence[str],
    *,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 180.0,
) -> ServiceProcess:
    """Start an agent (``training.agents.command``: ``{port}`` becomes a free loopback port, ``{python}``
    this Python) and wait until its gRPC health check is SERVING."""
    port = free_port()
    argv = [
        arg.replace(PORT_PLACEHOLDER, str(port)).replace(PYTHON_PLACEHOLDER, sys.executable)
        for arg in command
    ]
    agent = spawn_command("agent", argv, port, log_dir=log_dir, env=env)
    try:
        wait_serving(agent.target, agent.process, startup_timeout_s, f"agent ({argv[0]})")
    except BaseException:
        agent.stop(grace_s=5.0)
        raise
    return agent


def retry_on_taken_port(start: Callable[[], Started]) -> Started:
    """``start()``, called again while it fails with a service that could not bind the port picked for it.

    ``start`` picks fresh ports on each call and stops what it started before raising.
    """
    for _ in range(PORT_ATTEMPTS - 1):
        try:
            return start()
        except ServiceExited as exited:
            if not exited.port_taken:
                raise
            logger.warning("%s: its port was taken before it bound it; starting again on fresh ports", exited)
    return start()


def start_service(
    module: str,
    args: Sequence[str] = (),
    *,
    port: int | None = None,
    startup_timeout_s: float = 180.0,
    **kwargs,
) -> ServiceProcess:
    """:func:`spawn_service`, then wait until it is SERVING (stopping it if it never is); without ``port``,
    on a fresh port again when the one picked was taken (:func:`retry_on_taken_port`)."""

    def start() -> ServiceProcess:
        service = spawn_service(module, args, port=port, **kwargs)
        try:
            wait_serving(service.target, service.process, startup_timeout_s, module)
        except BaseException:
            service.stop(grace_s=5.0)
            raise
        return service

    return start() if port else retry_on_taken_port(start)


@dataclass
class LocalServices:
    """Reward and rollout services started for one run; a context manager that stops them on exit."""

    reward: ServiceProcess | None = None
    rollout: ServiceProcess | None = None
    weight_shm_dir: Path | None = None  # the rollout service's, removed on close

    @property
    def reward_target(self) -> str:
        """``host:port`` of the reward service started here (ValueError when none was)."""
        if self.reward is None:
            raise ValueError("no reward service was started here")
        return self.reward.target

    @property
    def rollout_target(self) -> str:
        """``host:port`` of the rollout service started here (ValueError when none was)."""
        if self.rollout is None:
            raise ValueError("no rollout service was started here")
        return self.rollout.target

    def __enter__(self) -> LocalServices:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for service in (self.rollout, self.reward):
            if service is not None:
                service.stop()
        if self.weight_shm_dir is not None:
            shutil.rmtree(self.weight_shm_dir, ignore_errors=True)
            self.weight_shm_dir = None


def shared_memory_dir(root: Path = SHARED_MEMORY_ROOT) -> Path | None:
    """A new private directory under ``root`` for weight buckets, named after this process
    (``grpo-weight-shm-<pid>-<random>``), or None where ``root`` is not a writable directory (no
    ``/dev/shm``: the stream is used). Directories left by processes that are gone are removed first."""
    if not (root.is_dir() and os.access(root, os.W_OK | os.X_OK)):
        return None
    remove_orphaned_shared_memory(root)
    return Path(tempfile.mkdtemp(prefix=f"{SHARED_MEMORY_PREFIX}{os.getpid()}-", dir=root))


def remove_orphaned_shared_memory(root: Path = SHARED_MEMORY_ROOT) -> list[Path]:
    """Remove this user's :func:`shared_memory_dir` directories whose process no longer runs.

    A trainer killed outright (SIGKILL of a run's process group, OOM) never closes its services, and a
    memory-backed directory, with the bucket files in it, would hold that memory until reboot. A pid that
    was reused keeps its directory (the safe side). Pids are this pid namespace's: containers that share one
    ``/dev/shm`` (``--ipc=host``) and run local services as the same user would see each other's as gone.
    Returns the directories removed."""
    removed = []
    for path in root.glob(f"{SHARED_MEMORY_PREFIX}*-*"):
        pid = path.name.removeprefix(SHARED_MEMORY_PREFIX).split("-", 1)[0]
        try:
            mine = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _settings_file(module: str, settings: dict, log_dir: Path | None) -> Path:
    """``settings`` written as ``MODULE.yaml``, the ``--config`` of a spawned service."""
    directory = log_dir or Path(tempfile.mkdtemp(prefix=f"{module}-config-"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}.yaml"
    path.write_text(json.dumps(settings))  # JSON is YAML
    return path


def _rollout_args(
    model: str | Path,
    engine: str,
    environment: str | None,
    services: LocalServices,
    gateway: bool,
    log_dir: Path | None,
) -> list[str]:
    """The command-line arguments of a local rollout service (see :func:`start_local_services`)."""
    args = ["--model", str(model), "--engine", engine]
    if environment is not None:
        target = environment
        if environment == "reward":
            if services.reward is None:
                raise ValueError("environment='reward' needs the reward service started here")
            target = services.reward.target
        # Its episodes dial the environment service by default.
        episodes = {"episodes": {"targets": {"default": target}}}
        args += ["--config", str(_settings_file("rollout_service", episodes, log_dir))]
    if gateway:
        args += ["--openai-port", "0"]
    if services.weight_shm_dir is not None:
        args += ["--weight-shm-dir", str(services.weight_shm_dir)]
    return args


def start_local_services(
    *,
    need_reward: bool,
    need_rollout: bool,
    model: str | Path,
    engine: str = "hf",
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 180.0,
    rollout_threads: int | None = None,
    environment: str | None = None,
    reward_settings: dict | None = None,
    gateway: bool = False,
) -> LocalServices:
    """Start the services a run lacks, side by side, and wait until each is SERVING.

    ``rollout_threads``: torch threads of the rollout service (None = torch's default, one per core); an
    async run on CPU passes ``overlap_threads()[1]``. ``environment``: the environment service the rollout
    service's episodes use as their default target; "reward" = the reward service started here.
    ``reward_settings``: the started reward service's settings (its ``--config``; None = its defaults).
    ``gateway``: the rollout service also serves its OpenAI gateway, on a free loopback port (its
    GetStatus reports which).
    The rollout service's ``weight_shm_dir`` is a new directory in ``/dev/shm`` where there is one
    (:func:`shared_memory_dir`). When a port picked here was taken, both start again on fresh ports
    (:func:`retry_on_taken_port`; the rollout service may name the reward service's address).
    """

    def start() -> LocalServices:
        services = LocalServices()
        try:
            if need_reward:
                reward_args = (
                    []
                    if reward_settings is None
                    else ["--config", str(_settings_file("reward_service", reward_settings, log_dir))]
                )
                services.reward = spawn_service("reward_service", reward_args, log_dir=log_dir, env=env)
            if need_rollout:
                services.weight_shm_dir = shared_memory_dir()
                rollout_args = _rollout_args(model, engine, environment, services, gateway, log_dir)
                rollout_env = {**(env or {}), **thread_env(rollout_threads)}
                services.rollout = spawn_service(
                    "rollout_service", rollout_args, log_dir=log_dir, env=rollout_env
                )
            for service in (services.reward, services.rollout):
                if service is not None:
                    wait_serving(service.target, service.process, startup_timeout_s, service.name)
        except BaseException:
            services.close()
            raise
        return services

    return retry_on_taken_port(start)
