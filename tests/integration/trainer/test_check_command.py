"""``python -m trainer_service check CONFIG``: exit status, the key named on errors, the resolved settings,
and the reward service's ListRewards used when one answers (a real reward server on loopback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from grpo_runtime.server import GrpcServer
from tests.integration.reward.fixtures import SETTINGS, reward_server_thread
from tests.support.run_configs import merged
from trainer_service.__main__ import main


@pytest.fixture(scope="module")
def reward_server() -> Iterator[GrpcServer]:
    with reward_server_thread(SETTINGS) as running:
        yield running


def write_run(tmp_path: Path, rows: list[dict], services: dict | None = None, **training) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "base": "tests/assets/models/policy",
        "output": str(tmp_path / "runs"),
        "data": {"train": str(data), "max_prompt_length": 48},
        "training": merged({"generation": {"max_completion_length": 16}}, training),
        "services": services or {},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


ROWS = [{"prompt": "What is 2 + 2?", "answer": "4"}, {"prompt": "What is 3 + 3?", "answer": "6"}]


def test_valid_config_prints_resolved_settings(tmp_path, capsys):
    path = write_run(
        tmp_path,
        ROWS,
        loss={"variant": "gspo"},
        optimizer={"per_device_train_batch_size": "auto"},
        sampling={"dynamic_sampling": {}},
    )
    assert main(["check", str(path)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    resolved = printed["resolved"]
    assert isinstance(resolved["batch_size"], int) and resolved["batch_size"] % 4 == 0
    assert "batch_size auto" in resolved["batch_size_auto"]
    assert (resolved["grpo_config"]["epsilon"], resolved["grpo_config"]["epsilon_high"]) == (3e-4, 4e-4)
    assert resolved["grpo_config"]["importance_sampling_level"] == "sequence"
    assert resolved["rows"] == {"train": 2}
    assert "built-in" in resolved["reward_metadata_checked_against"]
    assert printed["config"]["training"]["sampling"]["dynamic_sampling"] == {
        "filter": "zero_std",
        "max_gen_batches": 4,
    }


@pytest.mark.parametrize(
    ("rows", "training", "fragment"),
    [
        (
            ROWS,
            {"sampling": {"dynamic_sampling": {"max_gen_batches": 1}}},
            "training.sampling.dynamic_sampling.max_gen_batches",
        ),
        (ROWS, {"loss": {"variant": "cispo"}}, "training.loss.epsilon_high"),
        ([{"prompt": "no answer here"}], {}, "train row 0 is missing or empty 'answer'"),
        (
            ROWS,
            {"optimizer": {"per_device_train_batch_size": 6}},
            "training.optimizer.per_device_train_batch_size",
        ),
    ],
)
def test_errors_exit_non_zero_naming_the_key(tmp_path, capsys, rows, training, fragment):
    assert main(["check", str(write_run(tmp_path, rows, **training))]) == 2
    assert fragment in capsys.readouterr().err


def test_reward_service_metadata_is_checked_when_it_answers(tmp_path, capsys, reward_server):
    services = {"reward": f"127.0.0.1:{reward_server.port}", "rollout": "127.0.0.1:1"}
    ok = write_run(tmp_path / "ok", ROWS, services=services)
    assert main(["check", str(ok)]) == 0
    assert (
        "ListRewards of 127.0.0.1"
        in yaml.safe_load(capsys.readouterr().out)["resolved"]["reward_metadata_checked_against"]
    )
    # Only the service knows this reward does not exist; without one, check cannot tell.
    unknown = write_run(
        tmp_path / "unknown", ROWS, services=services, rewards={"reward_fn": "no_such_reward"}
    )
    assert main(["check", str(unknown)]) == 2
    assert "training.rewards.reward_fn: reward 'no_such_reward' is not offered" in capsys.readouterr().err
    code_rows = [{"prompt": "write f", "answer": "x"}]
    code = write_run(tmp_path / "code", code_rows, services=services, rewards={"reward_fn": "code"})
    assert main(["check", str(code)]) == 2
    assert "'tests' or 'expected', required by reward 'code'" in capsys.readouterr().err


def test_unreachable_reward_service_falls_back_to_the_built_in_requirements(tmp_path, capsys):
    services = {"reward": "127.0.0.1:1", "rollout": "127.0.0.1:1"}
    assert main(["check", str(write_run(tmp_path, ROWS, services=services))]) == 0
    assert (
        "did not answer"
        in yaml.safe_load(capsys.readouterr().out)["resolved"]["reward_metadata_checked_against"]
    )


def test_every_config_error_is_printed_on_a_line_of_its_own(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(
        yaml.safe_dump(
            {"base": "m", "data": {"train": "t.jsonl"}, "training": {"lr": 1e-3, "num_generation": 4}}
        )
    )
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "check: training.lr: moved to training.optimizer.learning_rate",
        "check: training.num_generation: unknown key; did you mean training.generation.num_generations?",
    ]
