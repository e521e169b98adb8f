"""Domain → protobuf for the trainer service's responses (no logic beyond field mapping):
``X_message(domain)`` builds message X. Its requests carry no more than an id or the config text, read where
they are handled. The other side of these messages, read back into the domain types, is the client's
(:mod:`trainer_service.client`).
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp
from grpo.trainer.v1 import trainer_pb2

from trainer_service.core.types import JobEvent, RunInfo, RunState

_STATES = {
    RunState.PENDING: trainer_pb2.RUN_STATE_PENDING,
    RunState.RUNNING: trainer_pb2.RUN_STATE_RUNNING,
    RunState.STOPPING: trainer_pb2.RUN_STATE_STOPPING,
    RunState.COMPLETED: trainer_pb2.RUN_STATE_COMPLETED,
    RunState.STOPPED: trainer_pb2.RUN_STATE_STOPPED,
    RunState.FAILED: trainer_pb2.RUN_STATE_FAILED,
}


def run_state_value(state: RunState) -> int:
    return _STATES[state]


def _timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def _metrics(values: dict[str, float]) -> dict[str, float]:
    # NaN is a legal double on the wire: a NaN reward means "no completion was scorable", keep it.
    return {key: float(value) for key, value in values.items()}


def run_event_message(run_id: str, event: JobEvent) -> trainer_pb2.RunEvent:
    return trainer_pb2.RunEvent(
        run_id=run_id,
        step=event.step,
        total_steps=max(event.total_steps, 0),
        metrics=_metrics(event.metrics),
        state=run_state_value(event.state),
        message=event.message,
        time=_timestamp(event.time),
    )


def run_info_message(info: RunInfo) -> trainer_pb2.RunInfo:
    return trainer_pb2.RunInfo(
        run_id=info.run_id,
        state=run_state_value(info.state),
        step=info.step,
        total_steps=max(info.total_steps, 0),
        output_dir=info.output_dir,
        metrics=_metrics(info.metrics),
        message=info.message,
        created_at=_timestamp(info.created_at),
    )
