"""Helpers shared by the trainer integration tests: a short run's config, confined service settings, a
crash-and-restart event sink."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.run_configs import merged
from trainer_service.core.types import JobEvent
from trainer_service.local.launcher import ServiceProcess
from trainer_service.settings import TrainerServiceSettings

# The shipped demo policy and its data (``make run``): a model whose accuracy can move in a few steps.
REPO = Path(__file__).resolve().parents[3]
DEMO_MODEL = REPO / "models" / "demo"
DEMO_DATA = REPO / "data" / "demo"
# Where the tests' models live: the tiny models (tests/conftest.py) and the shipped ones.
MODEL_ROOTS = [REPO / "tests" / "assets" / "models", REPO / "models"]


def confined_settings(root: Path, **overrides) -> TrainerServiceSettings:
    """Trainer service settings whose runs root is ``root/runs``, data root ``root``, secret root
    ``root/secrets`` and model roots the tests' model directories: what a StartRun of these tests may
    touch."""
    fields = {
        "stop_grace_s": 5.0,
        "runs_root": root / "runs",
        "data_roots": [root],
        "model_roots": MODEL_ROOTS,
        "secret_roots": [root / "secrets"],
        **overrides,
    }
    return TrainerServiceSettings(**fields)


def run_config(
    tiny_models,
    train_file: Path,
    output: Path,
    reward_address: str,
    rollout_address: str | list[str],
    /,
    *,
    retry_timeout_s: float | None = None,
    **training,
) -> dict:
    """The run config of a short LoRA GRPO run on the tiny policy (4 completions per step, G = 2) against the
    given reward and rollout addresses; ``training`` blocks override the defaults key by key (the addresses
    are positional-only, so a ``rollout`` block is a training override)."""
    services: dict = {"reward": reward_address, "rollout": rollout_address}
    if retry_timeout_s is not None:
        services["retry_timeout_s"] = retry_timeout_s
    return {
        "base": str(tiny_models["policy"]),
        "output": str(output),
        "data": {"train": str(train_file)},
        "training": merged(
            {
                "seed": 7,
                "optimizer": {"per_device_train_batch_size": 4, "learning_rate": 1e-3},
                "generation": {"num_generations": 2, "max_completion_length": 8},
                "rewards": {"reward_fn": "accuracy:1.0,repetition_penalty:0.5"},
                "model": {"lora": {"r": 4, "alpha": 8}},
            },
            training,
        ),
        "services": services,
    }


class CrashAndRestart:
    """A ``run_job`` event sink: after step ``after_step`` it SIGKILLs ``service`` and, from a thread, waits
    ``delay_s`` and calls ``start`` (a new process on the same port), as a crash and a supervisor would.

    ``service``: the running process (the restarted one afterwards); ``killed_at``: when it was killed.
    """

    def __init__(
        self,
        service: ServiceProcess,
        start: Callable[[], ServiceProcess],
        *,
        after_step: int = 2,
        delay_s: float = 0.0,
    ) -> None:
        self.service = service
        self.start = start
        self.after_step = after_step
        self.delay_s = delay_s
        self.killed_at: float | None = None
        self.error: Exception | None = None
        self.restarted = threading.Event()

    def __call__(self, event: JobEvent) -> None:
        if event.step == self.after_step and event.metrics and self.killed_at is None:
            self.killed_at = time.monotonic()
            os.kill(self.service.process.pid, signal.SIGKILL)
            self.service.process.wait()
            threading.Thread(target=self._restart, daemon=True).start()

    def _restart(self) -> None:
        time.sleep(self.delay_s)
        try:
            self.service = self.start()
        except Exception as error:  # reported by check(), with the service log
            self.error = error
        self.restarted.set()

    def check(self, timeout_s: float = 300.0) -> None:
        """Wait for the restart; fail (with the log tail) unless both the kill and the restart happened."""
        self.restarted.wait(timeout=timeout_s)
        assert self.killed_at is not None, f"the run never reached step {self.after_step}"
        assert self.restarted.is_set(), f"no restart within {timeout_s} s"
        if self.error is not None:
            log = self.service.log_path
            tail = log.read_text()[-2000:] if log is not None and log.exists() else "(no log)"
            pytest.fail(f"restart failed: {self.error}\n{tail}")
