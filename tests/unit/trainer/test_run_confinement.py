"""What a StartRun config may touch, checked without gRPC: finite numbers everywhere in the run config, paths
confined to the service's roots, the output directory's lock and completion record."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_runtime.errors import FailedPrecondition, InvalidArgument
from tests.support.hostile_inputs import alias_bomb, output_lock_holder
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.core import output_dir as outputs
from trainer_service.core.confinement import RunRoots, confine
from trainer_service.settings import TrainerServiceSettings


def base_config(tmp_path: Path, **overrides) -> dict:
    (tmp_path / "data").mkdir(exist_ok=True)
    config = {
        "base": "m",
        "output": str(tmp_path / "runs"),
        "experiment_name": "exp",
        "data": {"train": str(tmp_path / "data" / "train.jsonl")},
    }
    config.update(overrides)
    return config


@pytest.fixture
def roots(tmp_path) -> RunRoots:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text("t0ken\n")
    return RunRoots.of(
        TrainerServiceSettings(
            runs_root=tmp_path / "runs", data_roots=[tmp_path / "data"], secret_roots=[tmp_path / "secrets"]
        )
    )


# -- numbers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("training: {optimizer: {learning_rate: .nan}}", "training.optimizer.learning_rate"),
        ("training: {optimizer: {learning_rate: .inf}}", "training.optimizer.learning_rate"),
        ("training: {generation: {temperature: .nan}}", "training.generation.temperature"),
        ("training: {generation: {temperature: 1.0e300}}", "training.generation.temperature"),
        ("training: {generation: {top_p: .nan}}", "training.generation.top_p"),
        ("training: {loss: {beta: .inf}}", "training.loss.beta"),
        ("training: {loss: {epsilon: .nan}}", "training.loss.epsilon"),
        ("training: {loss: {epsilon_high: .inf}}", "training.loss.epsilon_high"),
        ("training: {loss: {delta: .nan}}", "training.loss.delta"),
        ("training: {optimizer: {max_grad_norm: .inf}}", "training.optimizer.max_grad_norm"),
        ("training: {num_train_epochs: .inf}", "training.num_train_epochs"),
        ("training: {generation: {min_p: .nan}}", "training.generation.min_p"),
        ("training: {optimizer: {warmup_ratio: .nan}}", "training.optimizer.warmup_ratio"),
        ("training: {optimizer: {weight_decay: .inf}}", "training.optimizer.weight_decay"),
        ("training: {model: {lora: {alpha: .nan}}}", "training.model.lora.alpha"),
        ("training: {model: {lora: {dropout: .nan}}}", "training.model.lora.dropout"),
        ("training: {rewards: {reward_fn: 'accuracy:nan'}}", "training.rewards.reward_fn"),
        ("training: {rewards: {reward_fn: 'accuracy:1e300'}}", "training.rewards.reward_fn"),
        ("training: {rewards: {params: {length: {max_len: .inf}}}}", "training.rewards.params.length"),
        ("training: {loss: {params: {tau: [1.0, .nan]}}}", "training.loss.params"),
        ("training: {model: {fsdp_config: {x: {y: -.inf}}}}", "training.model.fsdp_config"),
        ("services: {request_timeout_s: .inf}", "services.request_timeout_s"),
        ("services: {retry_timeout_s: .nan}", "services.retry_timeout_s"),
        ("services: {startup_timeout_s: .inf}", "services.startup_timeout_s"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused_naming_the_key(yaml_text, key):
    with pytest.raises(ConfigError) as error:
        parse_config(f"base: m\ndata: {{train: t}}\n{yaml_text}\n")
    assert error.value.key == key, str(error.value)


def test_reward_term_weights_and_params_are_finite():
    config = parse_config(
        "base: m\ndata: {train: t}\ntraining: {rewards: {reward_fn: 'accuracy:2.5,format', "
        "params: {format: {strict: true, scale: 0.5}}}}\n"
    )
    assert [(t.name, t.weight, t.params) for t in config.training.rewards.reward_terms] == [
        ("accuracy", 2.5, {}),
        ("format", 1.0, {"strict": True, "scale": 0.5}),
    ]


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        (alias_bomb(), "alias bomb"),
        ("x: " + "[" * 200 + "]" * 200 + "\n", "nested deeper"),
        ("x: '" + "a" * (5 << 20) + "'\n", "bytes"),
        ("\x1f", "invalid YAML"),  # refused by PyYAML's reader before parsing starts
    ],
)
def test_hostile_yaml_is_refused_within_limits(yaml_text, fragment):
    with pytest.raises(ConfigError) as error:
        parse_config(yaml_text)
    assert fragment in str(error.value)


# -- paths ---------------------------------------------------------------------------------------------------


def test_paths_inside_the_roots_are_accepted(tmp_path, roots):
    config = parse_config(
        base_config(tmp_path, services={"admin_token_file": str(tmp_path / "secrets" / "token")})
    )
    assert confine(config, roots) == (tmp_path / "runs" / "exp").resolve()


def placed(value, tmp_path: Path):
    """``value`` with the RUNS/, DATA/ and SECRETS/ prefixes of its strings replaced by the test's roots."""
    if isinstance(value, dict):
        return {key: placed(item, tmp_path) for key, item in value.items()}
    if isinstance(value, str):
        for name in ("RUNS", "DATA", "SECRETS"):
            if value.startswith(f"{name}/"):
                return str(tmp_path / name.lower()) + value[len(name) :]
    return value


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"output": "/etc"}, "output"),
        ({"output": "/tmp", "experiment_name": None}, "output"),
        ({"experiment_name": "../escape"}, "experiment_name"),
        ({"experiment_name": "a/../../b"}, "experiment_name"),
        ({"experiment_name": "/etc"}, "experiment_name"),
        ({"output": "RUNS/../elsewhere"}, "output"),
        ({"output": "RUNS/x\x00y"}, "output"),
        ({"data": {"train": "/etc/passwd"}}, "data.train"),
        ({"data": {"train": "DATA/train.jsonl", "eval": "/etc/hostname"}}, "data.eval"),
        ({"data": {"train": "/dev/zero"}}, "data.train"),
        ({"services": {"admin_token_file": "/etc/shadow"}}, "services.admin_token_file"),
        ({"services": {"admin_token_file": "SECRETS/missing"}}, "services.admin_token_file"),
        ({"services": {"tls_ca_file": "/etc/ssl/certs/ca-certificates.crt"}}, "services.tls_ca_file"),
        ({"training": {"resume_from_checkpoint": "/tmp"}}, "training.resume_from_checkpoint"),
        ({"training": {"model": {"deepspeed": "/etc/hostname"}}}, "training.model.deepspeed"),
    ],
)
def test_paths_outside_the_roots_are_refused_naming_the_key(tmp_path, roots, overrides, key):
    config = parse_config(base_config(tmp_path, **placed(overrides, tmp_path)))
    with pytest.raises(InvalidArgument) as error:
        confine(config, roots)
    assert error.value.field == "config_yaml"
    assert error.value.message.startswith(f"{key}: "), error.value.message


def test_errors_about_huge_paths_stay_small(tmp_path, roots):
    """A status's details travel in gRPC metadata (8 KiB at most): a hostile path is cut in the message."""
    with pytest.raises(InvalidArgument) as error:
        confine(parse_config(base_config(tmp_path, output="/" + "x" * 200_000)), roots)
    assert error.value.message.startswith("output: ") and len(error.value.details) < 2000


def test_symlinks_and_devices_inside_the_roots_are_refused(tmp_path, roots):
    runs, data = tmp_path / "runs", tmp_path / "data"
    runs.mkdir()
    data.mkdir()
    (runs / "out").symlink_to("/tmp")
    (data / "link.jsonl").symlink_to("/etc/passwd")
    os.mkfifo(data / "fifo")
    (runs / "file").write_text("not a directory")
    cases = [
        ({"experiment_name": "out"}, r"output: .* is outside the allowed runs root"),
        ({"data": {"train": str(data / "link.jsonl")}}, r"data\.train: .* outside the allowed data roots"),
        ({"data": {"train": str(data / "fifo")}}, r"data\.train: .* must be a directory or a regular file"),
        ({"experiment_name": "file"}, r"output: .* must be a directory"),
    ]
    for overrides, pattern in cases:
        with pytest.raises(InvalidArgument, match=pattern):
            confine(parse_config(base_config(tmp_path, **overrides)), roots)


# -- the output directory's lock and completion record ---------------------------------------------------


def test_a_live_lock_holder_refuses_others_and_its_death_frees_the_directory(tmp_path):
    outputs.check_unlocked(tmp_path)  # no lock file yet
    with output_lock_holder(tmp_path) as pid:
        with pytest.raises(FailedPrecondition, match=rf"output: .* live run worker \(pid {pid}\)"):
            outputs.check_unlocked(tmp_path)
        with pytest.raises(FailedPrecondition, match="output: "):
            outputs.hold_lock(tmp_path)
    # The kernel released the killed holder's lock.
    os.close(outputs.hold_lock(tmp_path))
    outputs.check_unlocked(tmp_path)


def test_a_planted_lock_symlink_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / outputs.LOCK_FILE).symlink_to(target)
    with pytest.raises(OSError):
        outputs.hold_lock(tmp_path)
    assert not target.exists()


def test_completion_record_round_trip(tmp_path):
    assert outputs.completed_step(tmp_path) is None
    outputs.record_completion(tmp_path, 6, 6)
    assert outputs.completed_step(tmp_path) == 6
    outputs.clear_completion(tmp_path)
    assert outputs.completed_step(tmp_path) is None
    (tmp_path / outputs.COMPLETED_FILE).write_text("{broken")
    assert outputs.completed_step(tmp_path) is None


def test_a_resume_of_a_completed_run_has_nothing_to_train(tmp_path):
    def config(max_steps: int):
        return parse_config(base_config(tmp_path, training={"max_steps": max_steps}))

    output = config(6).output_dir
    output.mkdir(parents=True)
    assert outputs.completed_resume(config(6), resume=True) is None  # never completed
    outputs.record_completion(output, 6, 6)
    event = outputs.completed_resume(config(6), resume=True)
    assert event is not None and event.state.value == "completed" and event.step == event.total_steps == 6
    assert outputs.completed_resume(config(-1), resume=True) is not None
    assert outputs.completed_resume(config(8), resume=True) is None  # more steps asked for: train them
    # A fresh run forgets the completion (it may be stopped before it completes, then resumed).
    assert outputs.completed_resume(config(6), resume=False) is None
    assert outputs.completed_step(output) is None
