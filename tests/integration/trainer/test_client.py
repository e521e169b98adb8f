"""TrainerClient against a real TrainerService on loopback: domain types back, typed errors for failures."""

from __future__ import annotations

import pytest
import yaml

from grpo_runtime.call_errors import InvalidArgumentError, NotFoundError
from tests.integration.trainer.fixtures import MODEL_ROOTS, run_config
from tests.support.server_thread import server_thread
from trainer_service.client import TrainerClient
from trainer_service.core.types import JobEvent, RunInfo, RunState
from trainer_service.server import build
from trainer_service.settings import TrainerServiceSettings


@pytest.fixture
def trainer(tmp_path_factory):
    """A trainer service whose runs and data may be anywhere under pytest's temporary directory."""
    tmp = tmp_path_factory.getbasetemp()
    settings = TrainerServiceSettings(
        stop_grace_s=10, runs_root=tmp, data_roots=[tmp], model_roots=MODEL_ROOTS
    )
    with server_thread(lambda: build(settings)) as server, TrainerClient(server.address) as client:
        yield client


def test_failures_are_typed_errors_naming_the_field(trainer):
    assert trainer.list_runs() == []
    bad = yaml.safe_dump(
        {"base": "m", "data": {"train": "t"}, "training": {"optimizer": {"learning_rate": -1}}}
    )
    with pytest.raises(InvalidArgumentError) as invalid:
        trainer.start_run(bad)
    assert (
        invalid.value.field == "config_yaml" and "training.optimizer.learning_rate" in invalid.value.message
    )
    assert str(invalid.value).startswith("trainer service: INVALID_ARGUMENT: config_yaml: ")
    for call in (trainer.get_run, trainer.stop_run, lambda run_id: list(trainer.watch_run(run_id))):
        with pytest.raises(NotFoundError) as missing:
            call("nope")
        assert missing.value.field == "run_id"


@pytest.mark.slow
def test_a_run_started_watched_and_listed_through_the_client(
    trainer, tiny_models, services, train_file, tmp_path
):
    output = tmp_path / "run"
    config = run_config(
        tiny_models, train_file, output, services.reward.target, services.rollout.target, max_steps=2
    )
    run_id = trainer.start_run(yaml.safe_dump(config), run_id="via-client")
    assert run_id == "via-client"
    events = list(trainer.watch_run(run_id))
    assert all(isinstance(event, JobEvent) for event in events)
    assert events[-1].state is RunState.COMPLETED, events[-1].message
    assert [event.step for event in events if event.metrics] == [1, 2]
    info = trainer.get_run(run_id)
    assert isinstance(info, RunInfo) and info.state is RunState.COMPLETED
    assert info.step == info.total_steps == 2
    assert info.output_dir == str(output.resolve()) and info.created_at > 0
    assert [run.run_id for run in trainer.list_runs()] == [run_id]
