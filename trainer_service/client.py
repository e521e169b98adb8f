"""Blocking client of the trainer service: start, watch, inspect and stop training runs.

    from trainer_service.client import TrainerClient

    with TrainerClient("127.0.0.1:50053", admin_token=token) as trainer:
        run_id = trainer.start_run(Path("configs/demo.yaml").read_text())
        for event in trainer.watch_run(run_id):       # JobEvent: step, total_steps, state, metrics, message
            print(event.step, event.state)
        info = trainer.get_run(run_id)                # RunInfo
        trainer.stop_run(run_id); trainer.list_runs()

StartRun and StopRun are admin RPCs (``admin_token`` when the server requires one). A failed call raises the
:class:`~grpo_runtime.call_errors.ServiceCallError` of its status (InvalidArgumentError naming the config
key, NotFoundError for an unknown run, ...). Calls are not retried beyond the channel's quick UNAVAILABLE
retries unless ``retry_budget_s`` is set: StartRun is not idempotent, and WatchRun is never retried (it
would repeat the events already seen).
"""

from __future__ import annotations

from collections.abc import Iterator

from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.client import ChannelConfig, ServiceClient
from trainer_service import codec
from trainer_service.core.types import JobEvent, RunInfo


class TrainerClient(ServiceClient):
    """Blocking client of ``grpo.trainer.v1.TrainerService`` (:class:`ServiceClient`), returning domain
    types."""

    service_name = "trainer service"
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    def __init__(
        self,
        target: str | ChannelConfig,
        *,
        admin_token: str | None = None,
        timeout_s: float | None = 60.0,
        retry_budget_s: float = 0.0,
    ) -> None:
        super().__init__(target, admin_token=admin_token, timeout_s=timeout_s, retry_budget_s=retry_budget_s)

    def start_run(self, config_yaml: str, *, run_id: str = "", resume: bool = False) -> str:
        """Start a run of ``config_yaml`` (a run config's YAML text); returns its id (``run_id``, or one the
        server picks when empty). ``resume`` continues from the newest checkpoint of its output."""
        request = trainer_pb2.StartRunRequest(config_yaml=config_yaml, run_id=run_id, resume=resume)
        return self._call("StartRun", request).run_id

    def watch_run(self, run_id: str, *, timeout_s: float | None = None) -> Iterator[JobEvent]:
        """The run's events from now until it ends (the stream has no deadline unless ``timeout_s``)."""
        messages = self._stream("WatchRun", trainer_pb2.WatchRunRequest(run_id=run_id), timeout_s=timeout_s)
        for message in messages:
            yield codec.decode_run_event(message)

    def get_run(self, run_id: str) -> RunInfo:
        return codec.decode_run_info(self._call("GetRun", trainer_pb2.GetRunRequest(run_id=run_id)).run)

    def stop_run(self, run_id: str) -> RunInfo:
        """Ask the run to stop at its next step; returns its state (STOPPING, or the state it ended in)."""
        return codec.decode_run_info(self._call("StopRun", trainer_pb2.StopRunRequest(run_id=run_id)).run)

    def list_runs(self) -> list[RunInfo]:
        response = self._call("ListRuns", trainer_pb2.ListRunsRequest())
        return [codec.decode_run_info(info) for info in response.runs]
