"""Training guards' detection (plain Python, no torch): each guard looks at one step and says what it found.

The config is :mod:`trainer_service.config.guards`; the trainer glue (reading TRL's logs, the completions,
the evaluations, and carrying out warn / halt / rollback) is :mod:`trainer_service.training.guard_callback`.

A guard's ``check`` returns the :class:`Finding` s of the step (empty = nothing wrong); :class:`Guards` runs
every configured guard and decides the step's action: the most severe among the findings (halt > rollback >
warn), a rollback turning into a halt once ``rollback.max_attempts`` rollbacks have been done.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer_service.config.guards import (
    EchoTrapConfig,
    EvalGateConfig,
    GuardAction,
    GuardsConfig,
    LossWatchdogConfig,
    RewardHackingConfig,
)

SEVERITY: dict[str, int] = {"none": 0, "warn": 1, "rollback": 2, "halt": 3}


@dataclass(frozen=True)
class Finding:
    """One guard's verdict on one signal: ``value`` crossed ``limit``."""

    guard: str
    signal: str
    value: float
    limit: float
    action: GuardAction


def repeated_ngram_ratio(tokens: Sequence[int], n: int) -> float:
    """``1 − distinct/total`` over the token n-grams of one completion: 0 = no n-gram repeats; a completion
    that is one n-gram said k times has ``(k − 1)/k``-ish. Shorter than n tokens: 0."""
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    distinct = {tuple(tokens[i : i + n]) for i in range(total)}
    return 1.0 - len(distinct) / total


class EchoTrap:
    name = "echo_trap"

    def __init__(self, config: EchoTrapConfig):
        self.config = config

    def check(self, completion_ids: Sequence[Sequence[int]]) -> list[Finding]:
        c = self.config
        if not completion_ids:
            return []
        echoing = sum(repeated_ngram_ratio(ids, c.ngram) >= c.max_repeat_ratio for ids in completion_ids)
        fraction = echoing / len(completion_ids)
        if fraction >= c.max_fraction and echoing:
            return [Finding(self.name, "echo_fraction", fraction, c.max_fraction, c.action)]
        return []


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


class RewardHacking:
    """Length trend, reward-term divergence and ``frac_reward_zero_std`` over a window of logged steps."""

    name = "reward_hacking"
    LENGTH = "completions/mean_length"

    def __init__(self, config: RewardHackingConfig):
        self.config = config
        self.history: deque[Mapping[str, float]] = deque(maxlen=config.window)

    def check(self, logs: Mapping[str, float]) -> list[Finding]:
        c = self.config
        self.history.append(dict(logs))
        found: list[Finding] = []
        zero_std = _finite(logs.get("frac_reward_zero_std"))
        if c.max_frac_zero_std is not None and zero_std is not None and zero_std > c.max_frac_zero_std:
            found.append(Finding(self.name, "frac_reward_zero_std", zero_std, c.max_frac_zero_std, c.action))
        if len(self.history) < c.window:
            return found
        first, last = self.history[0], self.history[-1]
        start, end = _finite(first.get(self.LENGTH)), _finite(last.get(self.LENGTH))
        if c.max_length_growth is not None and start and end is not None:
            growth = end / start - 1.0
            if growth > c.max_length_growth:
                found.append(Finding(self.name, "length_growth", growth, c.max_length_growth, c.action))
        if c.max_term_divergence is not None:
            changes = []
            for key in last:
                if key.startswith("rewards/") and key.endswith("/mean"):
                    before, after = _finite(first.get(key)), _finite(last.get(key))
                    if before is not None and after is not None:
                        changes.append(after - before)
            rise, fall = max(changes, default=0.0), min(changes, default=0.0)
            if rise > 0 > fall and rise - fall > c.max_term_divergence:
                divergence = rise - fall
                found.append(
                    Finding(self.name, "term_divergence", divergence, c.max_term_divergence, c.action)
                )
        return found


class LossWatchdog:
    name = "loss_watchdog"

    def __init__(self, config: LossWatchdogConfig):
        self.config = config
        self.over = 0  # consecutive steps with |loss| > threshold
        self.grad_over = 0  # consecutive steps with grad_norm > grad_norm_threshold

    def check(self, logs: Mapping[str, float]) -> list[Finding]:
        c = self.config
        found = []
        for key in ("loss", "grad_norm"):
            value = logs.get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                found.append(Finding(self.name, f"{key}_not_finite", float(value), c.threshold, c.action))
        if found:
            return found
        loss = _finite(logs.get("loss"))
        if loss is not None:
            self.over = self.over + 1 if abs(loss) > c.threshold else 0
            if self.over >= c.patience:
                found.append(Finding(self.name, "loss_spike", abs(loss), c.threshold, c.action))
        grad_norm = _finite(logs.get("grad_norm"))
        if c.grad_norm_threshold is not None and grad_norm is not None:
            self.grad_over = self.grad_over + 1 if grad_norm > c.grad_norm_threshold else 0
            if self.grad_over >= c.patience:
                found.append(
                    Finding(self.name, "grad_norm_spike", grad_norm, c.grad_norm_threshold, c.action)
                )
        return found


class EvalGate:
    """Regression of an evaluation against the step-0 evaluation or a baseline file's value."""

    name = "eval_gate"

    def __init__(self, config: EvalGateConfig):
        self.config = config
        self.baseline: float | None = None
        if config.baseline_file is not None:
            self.baseline = baseline_value(Path(config.baseline_file), config.metric)

    def check(self, step: int, metrics: Mapping[str, float]) -> list[Finding]:
        c = self.config
        value = _finite(metrics.get(c.metric))
        if value is None:
            return []
        if self.baseline is None:
            self.baseline = value  # the first evaluation (step 0) is the baseline
            return []
        if step == 0:
            return []
        limit = self.baseline - c.max_drop
        if value < limit:
            return [Finding(self.name, c.metric, value, limit, c.action)]
        return []


class BaselineError(ValueError):
    """A baseline file that cannot give the gate its metric."""


def baseline_value(path: Path, metric: str) -> float:
    """``metric`` from a JSON object file (or the last row of a JSON-lines file)."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        row = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError) as error:
        raise BaselineError(f"cannot read {str(path)!r}: {error}") from error
    value = _finite(row.get(metric)) if isinstance(row, dict) else None
    if value is None:
        raise BaselineError(f"{str(path)!r} has no finite number {metric!r}")
    return value


@dataclass
class StepVerdict:
    """What the guards decided about one step: ``action`` is ``none``, ``warn``, ``halt`` or ``rollback``."""

    step: int
    findings: list[Finding] = field(default_factory=list)
    action: str = "none"

    def record(self) -> dict[str, object]:
        return {"step": self.step, "action": self.action, "findings": [asdict(f) for f in self.findings]}


class Guards:
    """Every configured guard; :meth:`judge` one step at a time. ``rollbacks``: the rollbacks carried out
    (the caller counts them: a rollback without a checkpoint to restore is a halt, not an attempt)."""

    def __init__(self, config: GuardsConfig):
        self.config = config
        self.echo_trap = EchoTrap(config.echo_trap) if config.echo_trap else None
        self.reward_hacking = RewardHacking(config.reward_hacking) if config.reward_hacking else None
        self.loss_watchdog = LossWatchdog(config.loss_watchdog) if config.loss_watchdog else None
        self.eval_gate = EvalGate(config.eval_gate) if config.eval_gate else None
        self.rollbacks = 0

    def judge(
        self,
        step: int,
        logs: Mapping[str, float],
        completion_ids: Sequence[Sequence[int]] = (),
        evaluation: Mapping[str, float] | None = None,
    ) -> StepVerdict:
        """Run the guards on a step's logs, its batch's completions and (when one ran at this step) its
        evaluation; the action is the most severe finding's, rollback becoming halt past the attempt bound."""
        findings: list[Finding] = []
        if self.echo_trap is not None:
            findings += self.echo_trap.check(completion_ids)
        if self.reward_hacking is not None:
            findings += self.reward_hacking.check(logs)
        if self.loss_watchdog is not None:
            findings += self.loss_watchdog.check(logs)
        if self.eval_gate is not None and evaluation is not None:
            findings += self.eval_gate.check(step, evaluation)
        action = max((f.action for f in findings), key=SEVERITY.__getitem__, default="none")
        if action == "rollback" and self.rollbacks >= self.config.rollback.max_attempts:
            action = "halt"
        return StepVerdict(step, findings, action)
