"""The reward service's optional HTTP (OpenRLHF) port in deployments: off in the shipped overlays and compose
file, on with the ``reward-http`` kustomize component or the ``compose.http.yaml`` override — a named port,
the Service and NetworkPolicy admitting it like Score, a probe of its own (Kubernetes liveness, the compose
healthcheck) and the flags the reward service's CLI and healthcheck take."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from grpo_runtime.cli import build_parser
from reward_service.__main__ import _add_arguments as add_reward_arguments
from reward_service.http.healthcheck import build_parser as healthcheck_parser
from tests.deploy.k8s_render import OVERLAYS, REPO_ROOT, find, render, render_with_components

HTTP_PORT = 5000


def render_with_component(tmp_path: Path, overlay: str) -> list[dict]:
    """``overlay`` plus the reward-http component."""
    return render_with_components(overlay, ["reward-http"], tmp_path)


def port_text(port: str | dict) -> str:
    """A published port as docker-compose 1.29 prints it (``IP:PUBLISHED:TARGET/PROTO``); Compose v2 prints
    a mapping."""
    if isinstance(port, str):
        return port
    return f"{port['host_ip']}:{port['published']}:{port['target']}/{port.get('protocol', 'tcp')}"


def reward_container(objects: list[dict]) -> dict:
    [container] = find(objects, "Deployment", "reward")["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shipped_overlays_serve_no_http_port(overlay):
    objects = render(overlay)
    container = reward_container(objects)
    assert "--http-port" not in container["args"]
    assert HTTP_PORT not in {p["containerPort"] for p in container["ports"]}
    assert HTTP_PORT not in {p["port"] for p in find(objects, "Service", "reward")["spec"]["ports"]}


@pytest.mark.parametrize("overlay", ["cpu", "cpu-sandboxed"])
def test_component_adds_a_named_http_port_admitted_like_score(tmp_path, overlay):
    objects = render_with_component(tmp_path, overlay)
    container = reward_container(objects)
    args = container["args"]
    assert args[args.index("--http-port") + 1] == str(HTTP_PORT)
    assert {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"} in container["ports"]
    # The flags still parse as the reward service's own (the entrypoint is python -m reward_service).
    parser = build_parser("reward_service", "", 50051, add_reward_arguments)
    assert parser.parse_args(args).http_port == HTTP_PORT

    service_ports = {p["name"]: p for p in find(objects, "Service", "reward")["spec"]["ports"]}
    assert service_ports["http"]["port"] == HTTP_PORT and service_ports["http"]["targetPort"] == "http"
    assert service_ports["grpc"]["port"] == 50051  # the gRPC port stays

    # The HTTP port's own probe is liveness; gRPC keeps startup and readiness (RewardService) as in the base.
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    assert "grpc" not in container["livenessProbe"]
    base = reward_container(render(overlay))
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe] == base[probe] and "grpc" in container[probe]

    policy = find(objects, "NetworkPolicy", "reward")["spec"]
    http_rule = {"protocol": "TCP", "port": HTTP_PORT}
    admitted = [rule["from"] for rule in policy["ingress"] if http_rule in rule["ports"]]
    assert admitted == [[{"podSelector": {}}]]  # any pod in the namespace, as for Score
    assert policy["egress"] == []
    for doc in objects:
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_compose_override_publishes_the_http_port_on_loopback():
    def reward(*files: str) -> dict:
        command = ["docker-compose", *(a for f in files for a in ("-f", f)), "config"]
        env = {**os.environ, "GRPO_ADMIN_TOKEN_FILE": os.devnull}
        run = subprocess.run(
            command, cwd=REPO_ROOT / "docker", env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        return yaml.safe_load(run.stdout)["services"]["reward"]

    base = reward("compose.yaml")
    assert "--http-port" not in base["command"]
    with_http = reward("compose.yaml", "compose.http.yaml")
    # compose.yaml's command and one flag more, so the two files cannot drift apart.
    assert with_http["command"] == [*base["command"], "--http-port", str(HTTP_PORT)]
    assert set(map(port_text, with_http["ports"])) - set(map(port_text, base["ports"])) == {
        f"127.0.0.1:{HTTP_PORT}:{HTTP_PORT}/tcp"
    }
    # The healthcheck asks both ports; interval and retries stay compose.yaml's.
    assert with_http["healthcheck"]["test"] == [
        "CMD",
        "python",
        "-m",
        "reward_service.http.healthcheck",
        "--port",
        "50051",
        "--http-port",
        str(HTTP_PORT),
    ]
    assert {k: v for k, v in with_http["healthcheck"].items() if k != "test"} == {
        k: v for k, v in base["healthcheck"].items() if k != "test"
    }


def test_compose_healthcheck_flags_parse_and_name_the_commands_ports():
    """Without docker-compose: the override's healthcheck asks the ports its command serves on."""
    override = yaml.safe_load((REPO_ROOT / "docker" / "compose.http.yaml").read_text())["services"]["reward"]
    command = build_parser("reward_service", "", 50051, add_reward_arguments).parse_args(override["command"])
    kind, *argv = override["healthcheck"]["test"]
    assert kind == "CMD" and argv[:3] == ["python", "-m", "reward_service.http.healthcheck"]
    assert vars(healthcheck_parser().parse_args(argv[3:])) == {
        "host": "127.0.0.1",
        "port": command.port,
        "http_port": command.http_port,
        "timeout": 3.0,
    }
