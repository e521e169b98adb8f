"""Training guards' detection (echo trap, reward hacking, loss watchdog, eval gate), their verdicts and the
``training.guards`` config rules."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from trainer_service.config.guards import (
    EchoTrapConfig,
    EvalGateConfig,
    GuardsConfig,
    LossWatchdogConfig,
    RewardHackingConfig,
)
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.guard_callback import GuardCallback
from trainer_service.training.guards import (
    BaselineError,
    EchoTrap,
    EvalGate,
    Finding,
    Guards,
    LossWatchdog,
    RewardHacking,
    repeated_ngram_ratio,
)


def test_repeated_ngram_ratio():
    assert repeated_ngram_ratio([1, 2, 3, 4, 5, 6], 2) == 0.0
    # "a b a b a b a b": bigrams ab, ba, ab, ba, ab, ba, ab -> 2 distinct of 7.
    assert repeated_ngram_ratio([1, 2] * 4, 2) == pytest.approx(1 - 2 / 7)
    assert repeated_ngram_ratio([7] * 10, 1) == pytest.approx(0.9)
    assert repeated_ngram_ratio([1, 2], 4) == 0.0


def test_echo_trap_fires_on_a_batch_of_repeated_text_only():
    trap = EchoTrap(EchoTrapConfig(ngram=2, max_repeat_ratio=0.5, max_fraction=0.5))
    varied = [list(range(i, i + 8)) for i in range(4)]
    echo = [[5, 6] * 4, [9, 9, 9, 9, 9, 9, 9, 9]]
    assert trap.check(varied) == []
    assert trap.check(varied[:3] + echo[:1]) == []  # one of four echoes: under max_fraction
    [finding] = trap.check(varied[:2] + echo)
    assert finding.signal == "echo_fraction" and finding.value == 0.5 and finding.action == "warn"


def test_reward_hacking_length_growth_fires_past_the_limit():
    guard = RewardHacking(RewardHackingConfig(window=2, max_length_growth=0.5))
    assert guard.check({"completions/mean_length": 8.0}) == []
    assert guard.check({"completions/mean_length": 11.0}) == []
    [finding] = guard.check({"completions/mean_length": 17.0})
    assert finding.signal == "length_growth" and finding.value == pytest.approx(17 / 11 - 1)


def test_reward_hacking_term_divergence_and_zero_std():
    guard = RewardHacking(
        RewardHackingConfig(window=2, max_length_growth=None, max_term_divergence=0.3, max_frac_zero_std=0.8)
    )
    assert guard.check({"rewards/accuracy/mean": 0.5, "rewards/format/mean": 0.1}) == []
    # Both rise: no divergence.
    assert guard.check({"rewards/accuracy/mean": 0.6, "rewards/format/mean": 0.5}) == []
    [finding] = guard.check(
        {"rewards/accuracy/mean": 0.4, "rewards/format/mean": 0.9, "frac_reward_zero_std": 0.5}
    )
    assert finding.signal == "term_divergence" and finding.value == pytest.approx(0.4 + 0.2)
    [finding] = guard.check(
        {"rewards/accuracy/mean": 0.4, "rewards/format/mean": 0.9, "frac_reward_zero_std": 0.9}
    )
    assert finding.signal == "frac_reward_zero_std" and finding.value == 0.9


def test_loss_watchdog_non_finite_at_once_spikes_after_patience():
    dog = LossWatchdog(LossWatchdogConfig(threshold=5.0, patience=2))
    assert dog.check({"loss": 0.1}) == []
    [finding] = dog.check({"loss": math.nan})
    assert finding.signal == "loss_not_finite"
    [finding] = dog.check({"loss": 0.1, "grad_norm": math.inf})
    assert finding.signal == "grad_norm_not_finite"
    assert dog.check({"loss": 9.0}) == []  # one step over: patience 2
    assert dog.check({"loss": 0.0}) == []  # streak broken
    assert dog.check({"loss": -9.0}) == []
    [finding] = dog.check({"loss": 9.0})
    assert finding.signal == "loss_spike" and finding.value == 9.0 and finding.action == "halt"


def test_loss_watchdog_grad_norm_threshold_after_patience():
    dog = LossWatchdog(LossWatchdogConfig(threshold=5.0, grad_norm_threshold=50.0, patience=2))
    assert dog.check({"loss": 0.1, "grad_norm": 80.0}) == []  # one step over: patience 2
    assert dog.check({"loss": 0.1, "grad_norm": 3.0}) == []  # streak broken
    assert dog.check({"loss": 0.1, "grad_norm": 80.0}) == []
    [finding] = dog.check({"loss": 0.1, "grad_norm": 120.0})
    assert finding.signal == "grad_norm_spike" and finding.value == 120.0 and finding.limit == 50.0
    assert finding.action == "halt"
    # Both streaks long enough: one finding per signal.
    assert [f.signal for f in dog.check({"loss": 9.0, "grad_norm": 90.0})] == ["grad_norm_spike"]
    assert [f.signal for f in dog.check({"loss": 9.0, "grad_norm": 90.0})] == [
        "loss_spike",
        "grad_norm_spike",
    ]
    [finding] = dog.check({"loss": 0.1, "grad_norm": math.nan})
    assert finding.signal == "grad_norm_not_finite"


def test_loss_watchdog_grad_norm_threshold_is_off_by_default():
    dog = LossWatchdog(LossWatchdogConfig(threshold=5.0))
    assert dog.check({"loss": 0.1, "grad_norm": 1e12}) == []


def test_grad_norm_spike_takes_the_watchdog_action():
    guards = Guards(
        GuardsConfig(loss_watchdog=LossWatchdogConfig(action="rollback", grad_norm_threshold=10.0))
    )
    assert guards.judge(1, {"loss": 0.1, "grad_norm": 9.0}).action == "none"
    verdict = guards.judge(2, {"loss": 0.1, "grad_norm": 11.0})
    assert verdict.action == "rollback"
    assert verdict.record()["findings"][0]["signal"] == "grad_norm_spike"


def test_eval_gate_against_step_zero_and_a_baseline_file(tmp_path):
    gate = EvalGate(EvalGateConfig(max_drop=0.05))
    assert gate.check(0, {"accuracy_greedy": 0.5}) == []  # the baseline
    assert gate.check(10, {"accuracy_greedy": 0.46}) == []
    [finding] = gate.check(20, {"accuracy_greedy": 0.40})
    assert finding.value == 0.40 and finding.limit == pytest.approx(0.45)

    baseline = tmp_path / "eval_metrics.jsonl"
    baseline.write_text(
        json.dumps({"step": 0, "accuracy_greedy": 0.2})
        + "\n"
        + json.dumps({"step": 9, "accuracy_greedy": 0.9})
    )
    gate = EvalGate(EvalGateConfig(baseline_file=str(baseline), metric="accuracy_greedy"))
    assert gate.baseline == 0.9  # the last row
    assert gate.check(0, {"accuracy_greedy": 0.5}) == []  # step 0 is never judged
    assert len(gate.check(5, {"accuracy_greedy": 0.5})) == 1

    baseline.write_text(json.dumps({"pass@1": 0.3}))
    with pytest.raises(BaselineError, match="accuracy_greedy"):
        EvalGate(EvalGateConfig(baseline_file=str(baseline)))
    with pytest.raises(BaselineError, match="cannot read"):
        EvalGate(EvalGateConfig(baseline_file=str(tmp_path / "missing.json")))


def test_verdict_takes_the_most_severe_action_and_bounds_rollbacks():
    config = GuardsConfig(
        echo_trap=EchoTrapConfig(ngram=1, max_repeat_ratio=0.5, max_fraction=0.5, action="warn"),
        loss_watchdog=LossWatchdogConfig(threshold=1.0, action="rollback"),
        rollback={"max_attempts": 2},
    )
    guards = Guards(config)
    echo = [[1] * 8]
    assert guards.judge(1, {"loss": 0.1}, [[1, 2, 3]]).action == "none"
    verdict = guards.judge(2, {"loss": 0.1}, echo)
    assert verdict.action == "warn" and verdict.record()["findings"][0]["guard"] == "echo_trap"
    actions = []
    for step in (3, 4, 5):
        actions.append(guards.judge(step, {"loss": 5.0}, echo).action)
        guards.rollbacks += actions[-1] == "rollback"  # the callback counts the rollbacks it carries out
    assert actions == ["rollback", "rollback", "halt"] and guards.rollbacks == 2


BASE = {"base": "m", "data": {"train": "t", "eval": "e"}}


@pytest.mark.parametrize(
    ("training", "key", "fragment"),
    [
        ({"guards": {"echo_trap": {}}, "logging_steps": 2}, "training.logging_steps", "must be 1"),
        (
            {"guards": {"loss_watchdog": {"action": "rollback"}}},
            "training.guards.loss_watchdog.action",
            "save_steps",
        ),
        ({"guards": {"eval_gate": {}}}, "training.guards.eval_gate", "eval_steps"),
        (
            {"guards": {"echo_trap": {}, "rollback": {"beta_factor": 2.0}}},
            "training.guards.rollback.beta_factor",
            "training.loss.beta",
        ),
        ({"guards": {"echo_trap": {"action": "panic"}}}, "training.guards.echo_trap.action", "'warn'"),
        (
            {"guards": {"loss_watchdog": {"threshold": -1}}},
            "training.guards.loss_watchdog.threshold",
            "greater",
        ),
        ({"guards": {"rollback": {"max_attempts": 0}}}, "training.guards.rollback.max_attempts", "greater"),
        (
            {"guards": {"loss_watchdog": {"grad_norm_threshold": 0}}},
            "training.guards.loss_watchdog.grad_norm_threshold",
            "greater",
        ),
    ],
)
def test_guard_config_refusals_name_the_key(training, key, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "training": training})
    assert caught.value.key == key and fragment in str(caught.value)


def test_guard_config_accepted():
    config = parse_config(
        {
            **BASE,
            "training": {
                "save_steps": 5,
                "guards": {"eval_gate": {"action": "rollback"}, "rollback": {"beta_factor": 2.0}},
                "evaluation": {"eval_steps": 5},
                "loss": {"beta": 0.04},
            },
        }
    )
    assert config.training.guards.actions() == {"eval_gate": "rollback"}


def test_rollback_skips_the_weights_that_sampled_the_bad_batch(tmp_path):
    """A batch finding at step k is about the weights after step k - 1 - staleness; an eval finding about
    those after step k; after a rollback to checkpoint j, the weights serving are j's."""

    def callback(staleness: int) -> GuardCallback:
        guards = GuardCallback(Guards(GuardsConfig()), tmp_path, None, None, staleness=staleness)
        for step in (1, 2, 3, 4):
            (tmp_path / f"checkpoint-{step}").mkdir(exist_ok=True)
            guards.on_save(SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=step), None)
        return guards

    def finding(guard: str) -> list[Finding]:
        return [Finding(guard, "signal", 1.0, 0.5, "rollback")]

    sync = callback(staleness=0)
    sync.rule_out(5, finding("echo_trap"))  # step 5's batch came from checkpoint-4's weights
    assert sync.last_good_checkpoint() == (3, tmp_path / "checkpoint-3")
    sync.rule_out(4, finding("eval_gate"))  # evaluated on checkpoint-4's own weights: nothing new
    assert sync.last_good_checkpoint()[0] == 3
    late = callback(staleness=1)
    late.rule_out(5, finding("loss_watchdog"))  # as old as checkpoint-3's weights in async mode
    assert late.last_good_checkpoint()[0] == 2
    # Rolled back at step 6 to checkpoint-2: a bad batch at step 7 was sampled by checkpoint-2's weights.
    rolled = callback(staleness=0)
    rolled._restored_at[6] = 2
    rolled.rule_out(7, finding("reward_hacking"))
    assert rolled.last_good_checkpoint()[0] == 1
    rolled.rule_out(2, finding("echo_trap"))
    assert rolled.last_good_checkpoint() is None


def test_a_resume_keeps_the_guard_records_up_to_its_step_and_drops_a_torn_one(tmp_path):
    """Resuming from checkpoint-2 keeps guards.jsonl's records of steps 1 and 2; step 3's, and a last line
    a kill cut short, go (the resumed run writes what it finds again)."""
    path = tmp_path / "guards.jsonl"
    whole = [json.dumps({"step": step, "guard": "echo_trap"}) + "\n" for step in (1, 2, 3)]
    path.write_text("".join(whole) + '{"step": 4, "gua')
    guards = GuardCallback(Guards(GuardsConfig()), tmp_path, None, None)
    state = SimpleNamespace(is_world_process_zero=True, global_step=2)
    guards.on_train_begin(None, state, None)
    assert path.read_text() == "".join(whole[:2])
