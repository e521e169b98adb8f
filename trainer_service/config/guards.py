"""The ``training.guards`` block of the run config: soup-cli's training guards, each with an action.

Every guard is off unless its block is present. ``action``: ``warn`` (record it in ``guards.jsonl`` and the
run's events), ``halt`` (stop the run after a checkpoint), ``rollback`` (restore the newest checkpoint saved
at a step where no guard fired, then lower the learning rate / raise β as ``rollback`` says; after
``rollback.max_attempts`` rollbacks a firing rollback guard halts instead). The detection logic is
:mod:`trainer_service.training.guards`; torch-free, like the rest of ``config/``.

Example::

    guards:
      echo_trap: {action: warn, ngram: 4, max_repeat_ratio: 0.5, max_fraction: 0.5}
      reward_hacking: {action: warn, window: 10, max_length_growth: 0.5}
      loss_watchdog: {action: rollback, threshold: 10.0, grad_norm_threshold: 100.0, patience: 2}
      eval_gate: {action: halt, metric: accuracy_greedy, max_drop: 0.05}
      rollback: {max_attempts: 2, lr_factor: 0.5}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer_service.config.fields import StrictModel

GuardAction = Literal["warn", "halt", "rollback"]
ACTION_DESCRIPTION = "What a firing guard does: warn, halt (after a checkpoint) or rollback."


class EchoTrapConfig(StrictModel):
    """Completions that repeat themselves: a completion echoes when the share of its token n-grams that
    repeat an earlier n-gram of it, ``1 − distinct/total``, reaches ``max_repeat_ratio``; the guard fires
    when echoing completions make up at least ``max_fraction`` of the step's batch."""

    action: GuardAction = Field(default="warn", description=ACTION_DESCRIPTION)
    ngram: int = Field(default=4, ge=1, le=64, description="Length of the n-grams compared, in tokens.")
    max_repeat_ratio: float = Field(
        default=0.5, ge=0.0, le=1.0, description="1 − distinct/total n-grams at which a completion echoes."
    )
    max_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of echoing completions in a batch that fires the guard.",
    )


class RewardHackingConfig(StrictModel):
    """Signals that the policy games the reward, over the last ``window`` steps (each None = off):

    - ``max_length_growth``: mean completion length (TRL ``completions/mean_length``) of the window's last
      step over its first, minus 1 (0.5 = grew by half);
    - ``max_term_divergence``: with several reward terms, the largest rise of one term's mean minus the
      largest fall of another over the window (one term bought at another's cost);
    - ``max_frac_zero_std``: TRL's ``frac_reward_zero_std`` (groups whose rewards are all equal) of the step.
    """

    action: GuardAction = Field(default="warn", description=ACTION_DESCRIPTION)
    window: int = Field(default=10, ge=2, description="Steps the signals are judged over.")
    max_length_growth: float | None = Field(
        default=0.5, ge=0.0, description="Mean completion length growth over the window (0.5 = by half)."
    )
    max_term_divergence: float | None = Field(
        default=None, ge=0.0, description="Largest rise of one reward term minus largest fall of another."
    )
    max_frac_zero_std: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Share of groups whose rewards are all equal."
    )


class LossWatchdogConfig(StrictModel):
    """The loss: a NaN or infinite loss (or gradient norm) fires at once; ``|loss| > threshold`` fires after
    ``patience`` consecutive steps, and so does ``grad_norm > grad_norm_threshold`` (None = off). TRL logs
    ``grad_norm`` before clipping (``training.optimizer.max_grad_norm``), so a clipped spike still counts."""

    action: GuardAction = Field(default="halt", description=ACTION_DESCRIPTION)
    threshold: float = Field(default=10.0, ge=0.0, description="|loss| above this counts as a bad step.")
    grad_norm_threshold: float | None = Field(
        default=None, gt=0.0, description="Gradient norm above this counts as a bad step; None = off."
    )
    patience: int = Field(default=1, ge=1, description="Consecutive bad steps that fire the guard.")


class EvalGateConfig(StrictModel):
    """Held-out regression (needs ``training.evaluation.eval_steps``): fires when an evaluation after step 0
    has ``metric`` below the baseline minus ``max_drop``. The baseline is the step-0 evaluation, or the value
    of ``metric`` in ``baseline_file`` (a JSON object, e.g. an ``eval_metrics.jsonl`` row of an earlier
    run)."""

    action: GuardAction = Field(default="warn", description=ACTION_DESCRIPTION)
    metric: str = Field(default="accuracy_greedy", description="The eval_metrics.jsonl metric judged.")
    max_drop: float = Field(default=0.0, ge=0.0, description="Drop below the baseline that fires the guard.")
    baseline_file: str | None = Field(
        default=None, description="JSON object holding the baseline metric; None = the step-0 evaluation."
    )


class RollbackConfig(StrictModel):
    """What a rollback changes: ``lr_factor`` multiplies the learning rate, ``beta_factor`` the KL
    coefficient β (needs ``training.loss.beta > 0``: at 0 there is no reference model); ``max_attempts``
    bounds the rollbacks of a run."""

    max_attempts: int = Field(default=2, ge=1, le=100, description="Rollbacks a run may make.")
    lr_factor: float = Field(
        default=0.5, gt=0.0, le=1.0, description="Multiplies the learning rate at each rollback."
    )
    beta_factor: float = Field(
        default=1.0, ge=1.0, le=100.0, description="Multiplies the KL coefficient β at each rollback."
    )


class GuardsConfig(StrictModel):
    """Training guards, each off unless its block is present."""

    echo_trap: EchoTrapConfig | None = Field(default=None, description=EchoTrapConfig.__doc__)
    reward_hacking: RewardHackingConfig | None = Field(default=None, description=RewardHackingConfig.__doc__)
    loss_watchdog: LossWatchdogConfig | None = Field(default=None, description=LossWatchdogConfig.__doc__)
    eval_gate: EvalGateConfig | None = Field(default=None, description=EvalGateConfig.__doc__)
    rollback: RollbackConfig = Field(default_factory=RollbackConfig, description=RollbackConfig.__doc__)

    def actions(self) -> dict[str, GuardAction]:
        """The configured guards by name (``echo_trap``, ...) and their actions."""
        names = ("echo_trap", "reward_hacking", "loss_watchdog", "eval_gate")
        return {name: getattr(self, name).action for name in names if getattr(self, name) is not None}
