"""Several rollout replicas against REAL services on loopback: two HF-engine rollout servers (tiny policy),
each with its Prometheus endpoint, and one reward server.

- a step's prompt groups are split over both replicas and come back in prompt-major order;
- async rollout (prefetch) over both replicas keeps its staleness bound;
- a training run with ``services.rollout: [127.0.0.1:A, dns:///localhost:B]`` pushes every version to both
  (their GetStatus version equals the trainer's at the end) and both serve Generate calls (their
  ``grpo_rpc_requests_total`` counters);
- a replica killed with SIGKILL mid-run and restarted on the same port: the step waits, every replica gets
  the current weights again, the restarted one serves Generate again, and the run completes.
"""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from grpo_runtime.client import ChannelConfig
from rollout_service.client import RolloutClient
from tests.integration.trainer.fixtures import CrashAndRestart, run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import (
    ServiceProcess,
    free_port,
    spawn_service,
    start_service,
    wait_serving,
)
from trainer_service.rollout.replicas import RolloutReplicas
from trainer_service.rollout.service_rollout import SamplingConfig, ServiceRollout
from trainer_service.rollout.weight_sync import WeightSync
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow


class Replica:
    """A rollout server process with fixed gRPC and metrics ports (so it can be restarted in place)."""

    def __init__(self, model: Path, logs: Path, name: str):
        self.port, self.metrics_port = free_port(), free_port()
        self.args = ["--model", str(model), "--engine", "hf", "--metrics-port", str(self.metrics_port)]
        self.logs = logs / name
        self.process: ServiceProcess = spawn_service(
            "rollout_service", self.args, port=self.port, log_dir=self.logs
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def restart(self) -> None:
        self.process = start_service("rollout_service", self.args, port=self.port, log_dir=self.logs)

    def served(self, method: str) -> float:
        """Finished-OK calls of ``method`` this process has served (its Prometheus counter)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                wanted = labels.get("method") == method and labels.get("code") == "OK"
                if sample.name == "grpo_rpc_requests_total" and wanted:
                    return sample.value
        return 0.0

    def version(self) -> int:
        with RolloutClient(self.target) as client:
            return int(client.status().policy_version)


def addresses(fleet: dict) -> tuple[str, list[str]]:
    """(reward, rollout) of a run over both replicas: one fixed address and one DNS name (resolved again at
    every step)."""
    return fleet["reward"].target, [fleet["a"].target, f"dns:///localhost:{fleet['b'].port}"]


@pytest.fixture(scope="module")
def fleet(tiny_models, tmp_path_factory) -> Iterator[dict]:
    """Reward server and rollout replicas ``a`` and ``b``, started side by side."""
    logs = tmp_path_factory.mktemp("replica-logs")
    reward = spawn_service("reward_service", log_dir=logs / "reward")
    replicas = {name: Replica(tiny_models["policy"], logs, name) for name in ("a", "b")}
    try:
        wait_serving(reward.target, reward.process, 180, "reward_service")
        for replica in replicas.values():
            wait_serving(replica.target, replica.process.process, 180, "rollout_service")
        yield {"reward": reward, **replicas}
    finally:
        processes = [reward, *(replica.process for replica in replicas.values())]
        for service in processes:  # SIGTERM to all first: they drain side by side
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        for service in processes:
            service.stop()


def test_groups_are_sharded_over_replicas_and_merged_in_prompt_order(tiny_models, fleet):
    replicas = RolloutReplicas(
        [fleet["a"].target, fleet["b"].target], ChannelConfig(target=fleet["a"].target)
    )
    try:
        sync = WeightSync(replicas)
        sync.ready = replicas.refresh()
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=4)
        rollout = ServiceRollout(replicas, sync, sampling, num_generations=3)
        questions = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(4)]
        prompts = [question for question in questions for _ in range(3)]
        before = {name: fleet[name].served("Generate") for name in ("a", "b")}
        completions = rollout.generate(prompts, step=0)
    finally:
        replicas.close()
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    assert len(completions) == 12
    for prompt, completion in zip(prompts, completions, strict=True):
        expected = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)["input_ids"]
        assert completion.prompt_token_ids == expected
    # 4 groups over 2 replicas: one request of 2 groups (n=3) each.
    assert {name: fleet[name].served("Generate") - before[name] for name in ("a", "b")} == {"a": 1, "b": 1}


def test_every_version_reaches_both_replicas_and_both_generate(tiny_models, fleet, train_file, tmp_path):
    names = ("a", "b")
    generated = {name: fleet[name].served("Generate") for name in names}
    pushed = {name: fleet[name].served("UpdateWeights") for name in names}
    config = run_config(
        tiny_models, train_file, tmp_path / "two", *addresses(fleet), retry_timeout_s=120, max_steps=3
    )
    result = run_job(parse_config(config))

    assert result.state is RunState.COMPLETED and result.step == 3
    assert result.weight_pushes == 4  # train begin + one per optimizer step, each to every replica
    for name in names:
        assert fleet[name].version() == result.policy_version
        assert fleet[name].served("UpdateWeights") - pushed[name] == 4
        assert fleet[name].served("Generate") - generated[name] >= 3, name  # a share of every step
    records = read_metrics(result.metrics_path)
    versions = [int(r["policy_version"]) for r in records]
    assert versions == list(range(versions[0], versions[0] + 3))
    assert all(r["rollout/replicas"] == 2 for r in records)


def test_async_rollout_keeps_its_staleness_bound_over_replicas(tiny_models, fleet, train_file, tmp_path):
    """Prefetched batches are sharded too; every trained batch is within max_staleness of the trainer."""
    generated = {name: fleet[name].served("Generate") for name in ("a", "b")}
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "async",
        *addresses(fleet),
        retry_timeout_s=120,
        max_steps=4,
        rollout={"async_rollout": True, "max_staleness": 1},
    )
    result = run_job(parse_config(config))

    assert result.state is RunState.COMPLETED and result.step == 4
    records = read_metrics(result.metrics_path)
    for record in records:
        assert 0 <= record["trainer_version"] - record["policy_version"] <= 1, record
    assert records[-1]["async/prefetch_hits"] >= 1
    for name in ("a", "b"):
        assert fleet[name].served("Generate") - generated[name] >= 4, name
        assert fleet[name].version() == result.policy_version


def test_a_replica_killed_and_restarted_mid_run_catches_up(tiny_models, fleet, train_file, tmp_path):
    """SIGKILL replica b after step 2 and restart it on the same port: step 3 waits for it, the current
    weights go to both replicas under a new version, and b generates again from them."""
    b: Replica = fleet["b"]

    def start() -> ServiceProcess:
        b.restart()
        return b.process

    crash = CrashAndRestart(b.process, start)
    config = run_config(
        tiny_models, train_file, tmp_path / "kill", *addresses(fleet), retry_timeout_s=120, max_steps=4
    )
    try:
        result = run_job(parse_config(config), sink=crash)
    finally:
        crash.restarted.wait(timeout=300)
    crash.check()
    assert result.state is RunState.COMPLETED and result.step == 4
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # begin + 4 steps + one push to every replica once b was back; step 3 trains on that push.
    assert result.weight_pushes == 6
    versions = [int(r["policy_version"]) for r in records]
    assert versions[2] == versions[1] + 2 and versions[3] == versions[2] + 1
    assert fleet["a"].version() == b.version() == result.policy_version
    # The restarted process got the weights (catch-up, after step 3, after step 4) and served steps 3 and 4.
    assert b.served("UpdateWeights") == 3
    assert b.served("Generate") >= 2
