"""Trainer-service faults with real reward and rollout services on loopback:

- ``kill -9`` of a trainer service (``python -m trainer_service``, a real subprocess) while its run trains:
  the run's worker is gone within seconds; while it lived, another service refused to resume into its output
  directory (the worker's lock), and once it is gone the resume is accepted;
- a resume of a run that completed trains no step: the final adapter, metrics.jsonl and the rollout
  service's weights are left as they were.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest
import yaml
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from grpo_runtime.client import create_sync_channel
from rollout_service.client import RolloutClient
from tests.integration.trainer.fixtures import confined_settings, run_config
from tests.support.server_thread import server_thread
from trainer_service.core.output_dir import LOCK_FILE
from trainer_service.local.launcher import free_port, start_service
from trainer_service.server import build

pytestmark = pytest.mark.slow

WORKER_GONE_S = 15.0


def gone(pid: int) -> bool:
    """True once ``pid`` has exited: a zombie waiting for its reaper counts, but only once its other threads
    are gone too (a killed multi-threaded leader shows Z while they still exit and hold its files)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X") and threads <= 1


def watch_until(stub, run_id: str, done) -> list[trainer_pb2.RunEvent]:
    """WatchRun's events until ``done(event)`` or the run's end."""
    events = []
    for event in stub.WatchRun(trainer_pb2.WatchRunRequest(run_id=run_id), timeout=600):
        events.append(event)
        if done(event):
            break
    return events


def ended(event) -> bool:
    return event.state in (
        trainer_pb2.RUN_STATE_COMPLETED,
        trainer_pb2.RUN_STATE_STOPPED,
        trainer_pb2.RUN_STATE_FAILED,
    )


def test_kill_9_of_the_service_stops_its_worker(tiny_models, services, train_file, tmp_path):
    settings = confined_settings(tmp_path, data_roots=[train_file.parent])
    settings_file = tmp_path / "trainer.yaml"
    settings_file.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
    output = tmp_path / "runs" / "killed"
    config_yaml = yaml.safe_dump(
        run_config(
            tiny_models, train_file, output, services.reward.target, services.rollout.target, max_steps=500
        )
    )
    service = start_service(
        "trainer_service", ["--config", str(settings_file)], port=free_port(), log_dir=tmp_path / "logs"
    )
    try:
        with create_sync_channel(service.target) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            run_id = stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml), timeout=60).run_id
            events = watch_until(stub, run_id, lambda e: bool(e.metrics) or ended(e))
            assert events[-1].state == trainer_pb2.RUN_STATE_RUNNING, events[-1].message
        worker_pid = int((output / LOCK_FILE).read_text())
        assert not gone(worker_pid)

        with server_thread(lambda: build(settings)) as other, create_sync_channel(other.address) as channel:
            other_stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            # The worker of the first service still writes the directory: no resume into it.
            with pytest.raises(grpc.RpcError) as refused:
                other_stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml, resume=True))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details().startswith("config_yaml: output: ")
            assert str(worker_pid) in refused.value.details()

            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait()
            killed_at = time.monotonic()
            while not gone(worker_pid) and time.monotonic() - killed_at < WORKER_GONE_S:
                time.sleep(0.1)
            assert gone(worker_pid), f"worker {worker_pid} outlived its service by {WORKER_GONE_S} s"

            # Its lock died with it: the resume is accepted now (and stopped at once).
            resumed = other_stub.StartRun(
                trainer_pb2.StartRunRequest(config_yaml=config_yaml, resume=True)
            ).run_id
            other_stub.StopRun(trainer_pb2.StopRunRequest(run_id=resumed))
    finally:
        service.stop(grace_s=5.0)


def snapshot(output: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and modification time (ns) of the final adapter and metrics.jsonl."""
    files = ("adapter_model.safetensors", "metrics.jsonl")
    return {name: ((output / name).read_bytes(), (output / name).stat().st_mtime_ns) for name in files}


def test_resuming_a_completed_run_trains_nothing(tiny_models, services, train_file, tmp_path):
    settings = confined_settings(tmp_path, data_roots=[train_file.parent])
    output = tmp_path / "runs" / "done"
    # save_steps 0: no checkpoint, so a resume that trained would start again from step 1.
    config_yaml = yaml.safe_dump(
        run_config(
            tiny_models,
            train_file,
            output,
            services.reward.target,
            services.rollout.target,
            max_steps=2,
            save_steps=0,
        )
    )
    with server_thread(lambda: build(settings)) as server, create_sync_channel(server.address) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        first = stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml)).run_id
        final = watch_until(stub, first, ended)[-1]
        assert final.state == trainer_pb2.RUN_STATE_COMPLETED and final.step == 2, final.message
        before = snapshot(output)
        with RolloutClient(services.rollout.target) as rollout:
            version = rollout.status().policy_version

        resumed = stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=config_yaml, resume=True)).run_id
        events = watch_until(stub, resumed, ended)
        with RolloutClient(services.rollout.target) as rollout:
            assert rollout.status().policy_version == version  # nothing pushed
    assert events[-1].state == trainer_pb2.RUN_STATE_COMPLETED, events[-1].message
    assert events[-1].step == events[-1].total_steps == 2
    assert "already completed" in events[-1].message
    assert not [e for e in events if e.metrics]
    assert snapshot(output) == before
