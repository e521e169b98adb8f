"""The trainer service's protobuf ↔ domain codec: both directions of each message, used by the servicer
(:mod:`trainer_service.api`) and the client (:mod:`trainer_service.client`) alike, so the two cannot drift
apart. No logic beyond field mapping.

``encode_X`` builds message X from domain values, ``decode_X`` reads it back. Only the responses carry
domain objects: the requests hold no more than a run id or the config's YAML text, read where they are
handled.
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


# ------------------------------------------------------------------ RunState
def encode_run_state(state: RunState) -> trainer_pb2.RunState:
    return _STATES[state]


def decode_run_state(value: int) -> RunState:
    return RunState[trainer_pb2.RunState.Name(value).removeprefix("RUN_STATE_")]


# ----------------------------------------------------- Timestamp, metrics
def _encode_time(seconds: float) -> Timestamp:
    """``seconds`` since the Unix epoch."""
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def _decode_time(stamp: Timestamp) -> float:
    """Seconds since the Unix epoch."""
    return stamp.ToNanoseconds() / 1e9


def _encode_metrics(values: dict[str, float]) -> dict[str, float]:
    # NaN is a legal double on the wire: a NaN reward means "no completion was scorable", keep it.
    return {key: float(value) for key, value in values.items()}


# ------------------------------------------------------------------ RunEvent
def encode_run_event(run_id: str, event: JobEvent) -> trainer_pb2.RunEvent:
    return trainer_pb2.RunEvent(
        run_id=run_id,
        step=event.step,
        total_steps=max(event.total_steps, 0),
        metrics=_encode_metrics(event.metrics),
        state=encode_run_state(event.state),
        message=event.message,
        time=_encode_time(event.time),
    )


def decode_run_event(message: trainer_pb2.RunEvent) -> JobEvent:
    """The event; its ``run_id`` is the one the caller watches."""
    return JobEvent(
        step=message.step,
        total_steps=message.total_steps,
        state=decode_run_state(message.state),
        metrics=dict(message.metrics),
        message=message.message,
        time=_decode_time(message.time),
    )


# ------------------------------------------------------------------- RunInfo
def encode_run_info(info: RunInfo) -> trainer_pb2.RunInfo:
    return trainer_pb2.RunInfo(
        run_id=info.run_id,
        state=encode_run_state(info.state),
        step=info.step,
        total_steps=max(info.total_steps, 0),
        output_dir=info.output_dir,
        metrics=_encode_metrics(info.metrics),
        message=info.message,
        created_at=_encode_time(info.created_at),
    )


def decode_run_info(message: trainer_pb2.RunInfo) -> RunInfo:
    return RunInfo(
        run_id=message.run_id,
        state=decode_run_state(message.state),
        step=message.step,
        total_steps=message.total_steps,
        output_dir=message.output_dir,
        metrics=dict(message.metrics),
        message=message.message,
        created_at=_decode_time(message.created_at),
    )
