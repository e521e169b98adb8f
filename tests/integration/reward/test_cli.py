"""``python -m reward_service``: start, serve, stop on SIGTERM; config errors name the key."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_config_error_names_the_key(tmp_path):
    config = tmp_path / "reward.yaml"
    config.write_text("sandbox:\n  memory_mb: lots\ncheckers:\n  workers: 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "reward_service", "--port", "0", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 2, proc.stderr
    assert "sandbox.memory_mb" in proc.stderr


@pytest.mark.slow
def test_serves_until_sigterm(tmp_path):
    port = _free_port()
    config = tmp_path / "reward.yaml"
    config.write_text("server:\n  grace_period_s: 1\ncheckers:\n  workers: 1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reward_service", "--port", str(port), "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=120)
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 60
            while True:
                status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
                if status == health_pb2.HealthCheckResponse.SERVING or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == health_pb2.HealthCheckResponse.SERVING
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            req = reward_pb2.ScoreRequest(samples=[reward_pb2.Sample(completion=r"\boxed{4}")])
            req.samples[0].metadata.update({"answer": "4"})
            req.rewards.add(name="accuracy")
            assert stub.Score(req, timeout=30).scores[0].reward == 1.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_http_port_flag_serves_get_reward_beside_grpc(tmp_path):
    port, http_port = _free_port(), _free_port()
    config = tmp_path / "reward.yaml"
    config.write_text("server:\n  grace_period_s: 1\ncheckers:\n  workers: 1\nhttp:\n  port: 1\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reward_service",
            "--port",
            str(port),
            "--config",
            str(config),
            "--http-port",  # beats http.port of the file
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=120)
        # The HTTP listener starts right after the gRPC server (and before it reports SERVING).
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"http://127.0.0.1:{http_port}/health", timeout=5).raise_for_status()
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "the HTTP endpoint never came up"
                time.sleep(0.2)
        body = {"query": ["\\boxed{4}"], "labels": ["4"]}
        reply = requests.post(
            f"http://127.0.0.1:{http_port}/get_reward", params={"rewards": "accuracy"}, json=body, timeout=60
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["rewards"] == [1.0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
