"""StressReward over a real reward server; ``python -m reward_service stress`` against it and in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf import json_format
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from reward_service.cli import stress as stress_command

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "stress.yaml"


@pytest.fixture(scope="module")
def stub(reward_server):
    with grpc.insecure_channel(reward_server.address) as channel:
        yield reward_pb2_grpc.RewardServiceStub(channel)


def request_of(data: dict) -> reward_pb2.StressRewardRequest:
    return json_format.ParseDict(data, reward_pb2.StressRewardRequest())


def test_stress_reward_flags_the_attacks_the_configuration_pays_for(stub):
    # The test server scores at most 8 samples per call: the 14 probes of a sample go in several calls.
    reply = stub.StressReward(request_of(yaml.safe_load(CONFIG.read_text())), timeout=120)
    attacks = {a.name: a for a in reply.attacks}
    assert reply.threshold == 0.75
    assert attacks["gold_boxed_no_reasoning"].flagged
    assert attacks["gold_boxed_no_reasoning"].max_reward == 1.5
    assert not attacks["empty"].flagged and attacks["empty"].max_reward == 0.0
    assert [s.id for s in attacks["empty"].scores] == ["sum", "fraction"]
    assert [c.name for c in attacks["empty"].scores[0].components] == ["accuracy", "format"]
    # The first sample has its own completion (the baseline), the second none.
    assert [s.id for s in reply.baseline] == ["sum", ""] and reply.baseline[0].reward == 1.5


@pytest.mark.parametrize(
    ("data", "code", "field"),
    [
        ({"rewards": [{"name": "format"}]}, grpc.StatusCode.INVALID_ARGUMENT, "samples"),
        (
            {"rewards": [{"name": "format"}], "samples": [{"completion": "x"}] * 17},
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "samples",
        ),
        (
            {"rewards": [{"name": "format"}], "samples": [{"completion": "x"}], "attacks": ["nope"]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "attacks[0]",
        ),
        (
            {"rewards": [{"name": "nope"}], "samples": [{"completion": "x"}]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "rewards[0].name",
        ),
    ],
)
def test_bad_stress_requests_name_the_field(stub, data, code, field):
    with pytest.raises(grpc.RpcError) as error:
        stub.StressReward(request_of(data), timeout=30)
    assert error.value.code() == code
    assert error.value.details().startswith(f"{field}:"), error.value.details()


def test_cli_against_the_server_exits_1_when_an_attack_is_flagged(reward_server):
    done = subprocess.run(
        [sys.executable, "-m", "reward_service", "stress", str(CONFIG), "--target", reward_server.address],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gold_boxed_no_reasoning" in done.stdout and "FLAGGED" in done.stdout
    assert "baseline sum: 1.5" in done.stdout


def test_cli_in_process_with_json_output(tmp_path, capsys):
    config = tmp_path / "format.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "rewards": [{"name": "tag_count"}],
                "samples": [{"prompt": [{"role": "user", "content": "Say hi."}]}],
                "attacks": ["empty", "format_only"],
            }
        )
    )
    settings = tmp_path / "reward.yaml"
    settings.write_text(yaml.safe_dump({"checkers": {"workers": 1}, "sandbox": {"enabled": False}}))
    assert stress_command([str(config), "--settings", str(settings), "--json", "--threshold", "0.9"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["threshold"] == 0.9
    assert [(a["name"], a.get("flagged", False)) for a in printed["attacks"]] == [
        ("empty", False),
        ("format_only", True),
    ]


def test_cli_config_errors_exit_2(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("rewards: [{name: format, colour: red}]\n")
    assert stress_command([str(config), "--target", "127.0.0.1:1"]) == 2
    assert "config error" in capsys.readouterr().err
