"""The trainer codec both ways: a run's events and infos decode, through the bytes gRPC sends, to what the
server encoded (a NaN metric kept, an unknown total of steps reported as 0)."""

from __future__ import annotations

import math

import pytest
from grpo.trainer.v1 import trainer_pb2

from trainer_service import codec
from trainer_service.core.types import JobEvent, RunInfo, RunState


def wire(message):
    return type(message).FromString(message.SerializeToString())


@pytest.mark.parametrize("state", list(RunState))
def test_every_run_state_decodes_to_itself(state):
    assert codec.decode_run_state(codec.encode_run_state(state)) == state


def test_an_event_decodes_to_what_the_server_encoded():
    event = JobEvent(
        step=3, total_steps=10, state=RunState.RUNNING, metrics={"reward": 0.5}, message="m", time=1.5
    )
    message = wire(codec.encode_run_event("run-1", event))
    assert message.run_id == "run-1"
    assert codec.decode_run_event(message) == event


def test_a_nan_metric_is_kept_and_an_unknown_total_reads_as_zero():
    event = JobEvent(step=0, total_steps=-1, state=RunState.PENDING, metrics={"reward": math.nan}, time=2.0)
    decoded = codec.decode_run_event(wire(codec.encode_run_event("r", event)))
    assert decoded.total_steps == 0 and math.isnan(decoded.metrics["reward"])


def test_a_run_info_decodes_to_what_the_server_encoded():
    info = RunInfo("run-2", RunState.FAILED, 4, 8, "/out/run-2", {"loss": 0.25}, "boom", 1234.25)
    assert codec.decode_run_info(wire(codec.encode_run_info(info))) == info


def test_the_unspecified_state_is_not_a_run_state():
    with pytest.raises(KeyError):
        codec.decode_run_state(trainer_pb2.RUN_STATE_UNSPECIFIED)
