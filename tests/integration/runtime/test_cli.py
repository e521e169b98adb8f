"""``run_service``: flags, config files and their errors, and SIGTERM on a real server process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

from grpo_runtime.cli import EXIT_BIND_ERROR
from grpo_runtime.client import create_channel


def test_help_lists_the_server_flags(test_service, capsys):
    assert test_service.main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--config", "--metrics-port", "--log-level", "--grace-period"):
        assert flag in out
    assert "default 50099" in out


def test_unknown_flag_is_a_usage_error(test_service, capsys):
    assert test_service.main(["--nope"]) == 2
    assert "unrecognized arguments: --nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config_text", "argv", "expected"),
    [
        ("server:\n  grace_period_s: soon\n", [], "server.grace_period_s: Input should be a valid number"),
        ("server:\n  bogus: 1\n", [], "server.bogus: unknown key"),
        (
            "server:\n  tls_cert_file: /x.pem\n",
            [],
            "server: tls_cert_file and tls_key_file must be set together",
        ),
        ("", ["--port", "70000"], "server.port: Input should be less than or equal to 65535"),
        ("greetin: hi\n", [], "greetin: unknown key"),
        ("- a list\n", [], "the top level must be a mapping"),
        ("server: [1\n", [], "invalid YAML"),
    ],
)
def test_config_errors_exit_2_with_one_line_naming_the_key(
    test_service, tmp_path, capsys, config_text, argv, expected
):
    config = tmp_path / "service.yaml"
    config.write_text(config_text)
    assert test_service.main(["--config", str(config), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("runtime_test_service: config error: ")
    assert expected in err


def test_missing_config_file_is_a_config_error(test_service, tmp_path, capsys):
    assert test_service.main(["--config", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


async def _read_until(
    stream: asyncio.StreamReader, pattern: str, lines: list[str], timeout_s: float
) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while True:
        line = await asyncio.wait_for(stream.readline(), max(0.1, deadline - time.monotonic()))
        if not line:
            raise AssertionError("server exited:\n" + "".join(lines))
        lines.append(line.decode())
        match = re.search(pattern, lines[-1])
        if match:
            return match


async def _wait_in_flight(metrics_port: int, timeout_s: float = 10) -> None:
    """Poll the server's metrics until one Generate call is in flight."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    in_flight = 'grpo_rpc_in_flight{method="Generate",service="grpo.rollout.v1.RolloutService"} 1.0'
    deadline = time.monotonic() + timeout_s

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    while True:
        if in_flight in await asyncio.to_thread(scrape):
            return
        assert time.monotonic() < deadline, "the slow call never reached the server"
        await asyncio.sleep(0.02)


@pytest.mark.slow
async def test_sigterm_reports_not_serving_finishes_in_flight_calls_and_exits_within_grace(
    test_service, tmp_path
):
    config = tmp_path / "service.yaml"
    config.write_text("greeting: hi\nserver:\n  grace_period_s: 30\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("GRPO_ADMIN_TOKEN", None)
    # The flag overrides the file's 30 s grace period.
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        test_service.__file__,
        "--port", "0", "--config", str(config), "--grace-period", "4", "--metrics-port", "0",
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )  # fmt: skip
    lines: list[str] = []
    try:
        serving = await _read_until(process.stderr, r"serving (\S+), (\S+) on 127\.0\.0\.1:(\d+)", lines, 30)
        metrics_port = json.loads(lines[-1])["metrics_port"]
        assert serving.group(1, 2) == ("grpo.rollout.v1.RolloutService", "grpo.trainer.v1.TrainerService")
        async with create_channel(f"127.0.0.1:{serving.group(3)}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            request = rollout_pb2.GenerateRequest(prompts=[rollout_pb2.Prompt(text="sleep:1.5")], n=1)
            slow = asyncio.ensure_future(stub.Generate(request, metadata=(("x-request-id", "slow-1"),)))
            await _wait_in_flight(metrics_port)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert (await slow).completions[0].text == "sleep:1.5"
            with pytest.raises(grpc.aio.AioRpcError):  # new calls are refused
                await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=2)
        _, rest = await asyncio.wait_for(process.communicate(), timeout=10)
        exited_after_s = time.monotonic() - signalled
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    lines += rest.decode().splitlines(keepends=True)
    assert process.returncode == 0, "".join(lines)
    assert exited_after_s < 4.0
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    access = [r for r in records if r.get("request_id") == "slow-1" and r["logger"] == "grpo_runtime.access"]
    assert access and access[0]["code"] == "OK" and access[0]["duration_ms"] >= 1400
    messages = [r["message"] for r in records]
    assert "SIGTERM received" in messages and "stopped" in messages


@pytest.mark.parametrize("blank", ["", "  \n"])
def test_a_blank_admin_token_in_the_environment_exits_2_naming_it(test_service, monkeypatch, capsys, blank):
    monkeypatch.setenv("GRPO_ADMIN_TOKEN", blank)
    assert test_service.main(["--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "runtime_test_service: config error: env GRPO_ADMIN_TOKEN: the admin token is empty or whitespace; "
        "set a token or remove env GRPO_ADMIN_TOKEN"
    )


def test_a_blank_admin_token_file_exits_2_naming_it(test_service, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("GRPO_ADMIN_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text(" \n")
    config = tmp_path / "service.yaml"
    config.write_text(f"server:\n  admin_token_file: {token}\n")
    assert test_service.main(["--port", "0", "--config", str(config)]) == 2
    assert "config error: server.admin_token_file" in capsys.readouterr().err


def test_a_taken_port_exits_with_the_bind_error_code_and_one_line(test_service, capsys):
    """A launcher that picked the port tells "taken meanwhile" (EXIT_BIND_ERROR) from a failure (1)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert test_service.main(["--port", str(port)]) == EXIT_BIND_ERROR
    err = capsys.readouterr().err.strip()  # after the log's "no admin token" warning
    assert err.splitlines()[-1] == (
        f"runtime_test_service: cannot bind 127.0.0.1:{port}: address in use or not available on this host"
    )
