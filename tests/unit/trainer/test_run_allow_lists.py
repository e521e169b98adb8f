"""What a StartRun config may name beyond data paths, checked without gRPC: function tools and reporting
integrations only from the service's allow-lists, models only under its model roots (or a hub id), unix
socket addresses only under its socket roots, an eval baseline only under its runs or data roots, no agent
command and no inline DeepSpeed config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_runtime.config import ConfigError
from grpo_runtime.errors import InvalidArgument
from trainer_service.config.run_config import parse_config
from trainer_service.core.confinement import RunAllowList, RunRoots, confine
from trainer_service.settings import TrainerServiceSettings, load_settings

MULTIPLY = "tests.support.tool_functions:multiply"
SHOUT = "tests.support.tool_functions:shout"


@pytest.fixture
def settings(tmp_path) -> TrainerServiceSettings:
    for name in ("runs", "data", "models/policy", "sockets"):
        (tmp_path / name).mkdir(parents=True)
    return TrainerServiceSettings(
        runs_root=tmp_path / "runs",
        data_roots=[tmp_path / "data"],
        model_roots=[tmp_path / "models"],
        socket_roots=[tmp_path / "sockets"],
        allowed_tools=[MULTIPLY],
        allowed_report_to=["tensorboard"],
    )


def config(tmp_path: Path, training: dict | None = None, **overrides):
    raw = {
        "base": str(tmp_path / "models" / "policy"),
        "output": str(tmp_path / "runs"),
        "experiment_name": "exp",
        "data": {"train": str(tmp_path / "data" / "train.jsonl")},
        "training": training or {},
        **overrides,
    }
    return parse_config(raw)


def refused_key(run_config, settings: TrainerServiceSettings) -> str:
    """The key the confinement error names (the text before the first ': ')."""
    with pytest.raises(InvalidArgument) as error:
        confine(run_config, RunRoots.of(settings), RunAllowList.of(settings))
    assert error.value.field == "config_yaml"
    return error.value.message.split(": ", 1)[0]


def accepted(run_config, settings: TrainerServiceSettings) -> bool:
    confine(run_config, RunRoots.of(settings), RunAllowList.of(settings))
    return True


# -- importable names ---------------------------------------------------------------------------------------


def test_only_allow_listed_tools_pass_and_the_error_names_the_entry(tmp_path, settings):
    assert accepted(config(tmp_path, {"tools": {"functions": [MULTIPLY]}}), settings)
    assert (
        refused_key(config(tmp_path, {"tools": {"functions": [SHOUT]}}), settings)
        == "training.tools.functions[0]"
    )
    assert (
        refused_key(config(tmp_path, {"tools": {"functions": [MULTIPLY, SHOUT]}}), settings)
        == "training.tools.functions[1]"
    )
    # Nothing is allowed without an allow-list: the default, and a caller of confine that passes none.
    defaults = TrainerServiceSettings(
        runs_root=tmp_path / "runs", data_roots=[tmp_path / "data"], model_roots=[tmp_path / "models"]
    )
    assert (
        refused_key(config(tmp_path, {"tools": {"functions": [MULTIPLY]}}), defaults)
        == "training.tools.functions[0]"
    )
    with pytest.raises(
        InvalidArgument, match=r"training\.tools\.functions\[0\]: .* allowed_tools \(none configured\)"
    ):
        confine(config(tmp_path, {"tools": {"functions": [MULTIPLY]}}), RunRoots.of(settings))


def test_the_refusal_says_which_setting_allows_a_tool(tmp_path, settings):
    with pytest.raises(InvalidArgument) as error:
        confine(
            config(tmp_path, {"tools": {"functions": [SHOUT]}}),
            RunRoots.of(settings),
            RunAllowList.of(settings),
        )
    assert SHOUT in error.value.message and f"allowed_tools ({MULTIPLY})" in error.value.message


@pytest.mark.parametrize(
    ("report_to", "key"),
    [
        ("wandb", "training.report_to"),
        ("all", "training.report_to"),
        (["none", "mlflow"], "training.report_to[1]"),
        (["tensorboard", "dvclive"], "training.report_to[1]"),
    ],
)
def test_reporting_integrations_outside_the_allow_list_are_refused(tmp_path, settings, report_to, key):
    assert refused_key(config(tmp_path, {"report_to": report_to}), settings) == key


@pytest.mark.parametrize("report_to", ["none", ["none"], "tensorboard", ["tensorboard", "none"]])
def test_none_and_allow_listed_integrations_pass(tmp_path, settings, report_to):
    assert accepted(config(tmp_path, {"report_to": report_to}), settings)


def test_the_allow_lists_are_validated_naming_the_setting():
    with pytest.raises(ConfigError, match=r"allowed_tools"):
        load_settings({"allowed_tools": ["not an import path"]})
    assert load_settings({"allowed_tools": [MULTIPLY]}).allowed_tools == [MULTIPLY]


# -- models --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", ["Qwen/Qwen2.5-0.5B-Instruct", "gpt2", "org/name.v1"])
def test_a_hub_id_that_names_no_local_path_is_accepted(tmp_path, settings, monkeypatch, base):
    monkeypatch.chdir(tmp_path)
    assert accepted(config(tmp_path, base=base), settings)


def test_a_model_directory_inside_the_model_roots_is_accepted(tmp_path, settings, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert accepted(config(tmp_path, base="models/policy"), settings)  # relative to the working directory
    rollout_model = {"rollout_model": str(tmp_path / "models" / "policy")}
    assert accepted(config(tmp_path, services=rollout_model), settings)


@pytest.mark.parametrize(
    "base",
    [
        "/etc",  # an existing directory outside the roots
        "/nonexistent/model",  # an absolute path is never a hub id
        "../models/policy",
        "./elsewhere",
        "a/b/c",  # three parts: a path, not ORG/NAME
        "data",  # reads as a hub id but names a local directory outside the model roots
        "link",  # a symlink inside the working directory to a directory outside the roots
        "dangling",  # a dangling symlink: transformers would read it as a path once its target exists
        "models/file",  # inside the roots but a file
        "x\x00y",
    ],
)
def test_a_model_path_outside_the_model_roots_is_refused(tmp_path, settings, monkeypatch, base):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to("/etc")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "models" / "file").write_text("not a model")
    assert refused_key(config(tmp_path, base=base), settings) == "base"
    rollout_model = config(tmp_path, services={"rollout_model": base})
    assert refused_key(rollout_model, settings) == "services.rollout_model"


# -- other paths ---------------------------------------------------------------------------------------------


def test_unix_socket_addresses_only_under_the_socket_roots(tmp_path, settings):
    inside = tmp_path / "sockets" / "rollout.sock"
    for target in (f"unix:{inside}", f"unix://{inside}"):
        assert accepted(config(tmp_path, services={"rollout": [target]}), settings)
    cases = {
        "services.rollout[1]": {"rollout": ["127.0.0.1:1", "unix:/run/docker.sock"]},
        "services.reward": {"reward": "unix:///var/run/docker.sock"},
        "services.environment": {"environment": f"unix:{tmp_path / 'sockets' / '..' / 'x.sock'}"},
    }
    for key, services in cases.items():
        assert refused_key(config(tmp_path, services=services), settings) == key
    # TCP addresses are not paths: the caller's choice, as before.
    assert accepted(
        config(tmp_path, services={"reward": "10.0.0.1:50051", "rollout": "dns:///r:1"}), settings
    )


def test_an_eval_baseline_only_under_the_runs_or_data_roots(tmp_path, settings):
    def with_baseline(path: Path | str):
        guards = {"eval_gate": {"baseline_file": str(path)}}
        data = {
            "train": str(tmp_path / "data" / "train.jsonl"),
            "eval": str(tmp_path / "data" / "eval.jsonl"),
        }
        return config(tmp_path, {"guards": guards, "evaluation": {"eval_steps": 1}}, data=data)

    (tmp_path / "runs" / "eval_metrics.jsonl").write_text('{"accuracy_greedy": 0.5}\n')
    os.mkfifo(tmp_path / "data" / "fifo")
    assert accepted(with_baseline(tmp_path / "runs" / "eval_metrics.jsonl"), settings)
    for path in ("/etc/passwd", "/dev/zero", tmp_path / "data" / "fifo", tmp_path / "runs"):
        assert refused_key(with_baseline(path), settings) == "training.guards.eval_gate.baseline_file"


def test_an_inline_deepspeed_config_is_refused_and_a_file_under_the_data_roots_is_not(tmp_path, settings):
    inline = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/etc"}}}
    assert (
        refused_key(config(tmp_path, {"model": {"deepspeed": inline}}), settings)
        == "training.model.deepspeed"
    )
    (tmp_path / "data" / "ds.json").write_text("{}")
    assert accepted(config(tmp_path, {"model": {"deepspeed": str(tmp_path / "data" / "ds.json")}}), settings)


def test_an_agent_command_is_refused_and_a_running_agent_is_not(tmp_path, settings):
    services = {"rollout": "127.0.0.1:50052"}
    command = {
        "command": ["{python}", "-m", "agent", "--port", "{port}"],
        "gateway_url": "http://127.0.0.1:8000",
    }
    spawned = config(tmp_path, {"agents": command}, services=services)
    assert refused_key(spawned, settings) == "training.agents.command"
    running = {"target": "127.0.0.1:50060", "gateway_url": "http://127.0.0.1:8000"}
    assert accepted(config(tmp_path, {"agents": running}, services=services), settings)


def test_every_agent_server_of_a_list_is_confined_and_named_by_its_index(tmp_path, settings):
    services = {"rollout": "127.0.0.1:50052"}
    inside = f"unix:{tmp_path / 'sockets' / 'agent.sock'}"
    agents = {"target": ["127.0.0.1:50060", inside], "gateway_url": "http://127.0.0.1:8000"}
    assert accepted(config(tmp_path, {"agents": agents}, services=services), settings)
    agents["target"] = [inside, "unix:/run/docker.sock"]
    refused = config(tmp_path, {"agents": agents}, services=services)
    assert refused_key(refused, settings) == "training.agents.target[1]"
