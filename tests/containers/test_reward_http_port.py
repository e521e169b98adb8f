"""The reward image's HTTP (OpenRLHF) port as deployed. docker/compose.http.yaml: the reward service alone,
healthy by the override's healthcheck (gRPC and ``GET /health``), ``/get_reward`` answering OpenRLHF 0.11's
requests on the port published on 127.0.0.1, and those requests counted on the metrics port. The
``reward-http`` kustomize component: the container started as the rendered Deployment declares it, every
probe it declares (gRPC and HTTP) succeeding, the Service's named ``http`` port serving ``/get_reward``.

Compose files as shipped, through the variables they read (free ports, a token file made here, a project name
of its own), with Debian's docker-compose 1.29 as in test_compose.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections.abc import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from grpo_runtime.healthcheck import check
from tests.containers.service_containers import Running, wait_serving
from tests.containers.test_compose import UP_TIMEOUT_S, Trio, wait_healthy
from tests.containers.test_k8s_manifests_in_containers import (  # noqa: F401 (host_volumes: a fixture)
    PROBES,
    host_volumes,
    published,
    run_as_rendered,
)
from tests.deploy.k8s_render import containers_of, find, render_with_components

HTTP_PORT = 5000
METRICS_PORT = 9090
PROMPT = "<|im_start|>user\n一加一等于几？ What is 1/2 + 1/2?<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "<think>\nhalf and half\n</think>\n<answer>\n\\boxed{1}\n</answer><|im_end|>"
# Prints the reward service's own /metrics from inside its container (the metrics port is not published).
READ_METRICS = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{METRICS_PORT}/metrics').read().decode())"


@pytest.fixture(scope="module")
def reward(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    if shutil.which("docker-compose") is None:
        missing = "docker-compose is not installed (apt-get install docker-compose)"
        if os.environ.get("REQUIRE_DOCKER") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    secrets_dir = tmp_path_factory.mktemp("compose-http-secrets")
    secrets_dir.chmod(0o700)
    token = secrets.token_hex(32)
    token_file = secrets_dir / "admin_token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o644)  # read by the container's uid 10001 through the bind mount
    project = f"grpo-http-test-{uuid.uuid4().hex[:8]}"
    compose = ["docker-compose", "-p", project, "-f", "compose.yaml", "-f", "compose.http.yaml"]
    env = {
        **os.environ,
        "GRPO_ADMIN_TOKEN_FILE": str(token_file),
        "GRPO_REWARD_PORT": "0",
        "GRPO_REWARD_HTTP_PORT": "0",
    }
    started = Trio(project, compose, env, token)
    try:
        up = started.run("up", "-d", "reward", timeout=UP_TIMEOUT_S)
        assert up.returncode == 0, f"compose up failed:\n{up.stderr}\n{started.logs()}"
        wait_healthy(started, ("reward",))  # by the override's healthcheck: both ports answer
        yield started
    finally:
        down = started.run("down", "-v", "--remove-orphans", "-t", "5", timeout=180)
        assert down.returncode == 0, down.stderr


def http_url(reward: Trio) -> str:
    published = reward.run("port", "reward", str(HTTP_PORT)).stdout.strip()  # "127.0.0.1:49153"
    host, port = published.rsplit(":", 1)
    assert host == "127.0.0.1", published
    return f"http://127.0.0.1:{port}"


def counted(metrics_text: str) -> dict[tuple[str, str, str], float]:
    """grpo_http_requests_total by (path, method, code) from a /metrics page."""
    [family] = [f for f in text_string_to_metric_families(metrics_text) if f.name == "grpo_http_requests"]
    return {
        (s.labels["path"], s.labels["method"], s.labels["code"]): s.value
        for s in family.samples
        if s.name == "grpo_http_requests_total"
    }


def http_requests(reward: Trio) -> dict[tuple[str, str, str], float]:
    """The compose reward service's request counts, read inside its container (the port is not published)."""
    metrics = reward.run("exec", "-T", "reward", "python", "-c", READ_METRICS)
    assert metrics.returncode == 0, metrics.stderr
    return counted(metrics.stdout)


def test_the_healthcheck_asks_the_http_port(reward: Trio) -> None:
    assert reward.health("reward") == "healthy"
    # The check the healthcheck runs fails against a port nobody serves HTTP on (the gRPC port here).
    wrong = reward.run(
        "exec", "-T", "reward", "python", "-m", "reward_service.http.healthcheck", "--port", "50051",
        "--http-port", "50051", "--timeout", "5",
    )  # fmt: skip
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr


def test_openrlhf_requests_are_answered_and_counted(reward: Trio) -> None:
    url = http_url(reward)
    before = http_requests(reward)
    kept = PROMPT.encode()[-59:].decode(errors="replace")  # OpenRLHF 0.11's left-truncated prompt
    # OpenRLHF 0.11 with two --remote_rm_url: the sample, then empty lists for the second URL.
    bodies = [
        {"query": [kept + ANSWER], "prompts": [PROMPT], "labels": ["1"]},
        {"query": [], "prompts": [], "labels": []},
    ]
    answers = [
        requests.post(f"{url}/get_reward", params={"rewards": "accuracy"}, json=b, timeout=60) for b in bodies
    ]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert answers[0].json()["rewards"] == [1.0]
    assert answers[1].json() == {
        "rewards": [],
        "scores": [],
        "extra_logs": {"accuracy": [], "reward_missing": []},
    }
    assert requests.get(f"{url}/no-such-path", timeout=60).status_code == 404

    after = http_requests(reward)
    key = ("/get_reward", "POST", "200")
    assert after[key] - before.get(key, 0.0) == 2
    assert after[("unmatched", "GET", "404")] >= 1
    # The healthcheck's GET /health is counted too: the container was healthy by it before this test.
    assert after[("/health", "GET", "200")] >= 1


@pytest.fixture(scope="module")
def reward_pod(images, request, tmp_path_factory) -> Iterator[tuple[dict, list[dict], Running]]:
    """(the reward container's spec, all rendered objects, the running container) of cpu + reward-http, on
    the volumes of test_k8s_manifests_in_containers."""
    pod_volumes = request.getfixturevalue("host_volumes")
    objects = render_with_components("cpu", ["reward-http"], tmp_path_factory.mktemp("kustomize"))
    [spec] = [c for c in containers_of(objects) if c["deployment"] == "reward"]
    running = run_as_rendered(spec, pod_volumes)
    try:
        wait_serving(running)
        yield spec, objects, running
    finally:
        running.remove()


def test_the_components_probes_succeed_and_its_service_port_serves(reward_pod) -> None:
    spec, objects, running = reward_pod
    named = {p["name"]: p["containerPort"] for p in spec["ports"]}
    for kind in PROBES:
        probe = spec[kind]
        if "grpc" in probe:
            assert check(published(running, probe["grpc"]["port"]), probe["grpc"].get("service", "")), kind
        else:
            get = probe["httpGet"]
            port = named.get(get["port"], get["port"])
            reply = requests.get(f"http://{published(running, port)}{get['path']}", timeout=10)
            assert reply.status_code == 200 and reply.json()["status"] == "SERVING", (kind, reply.text)
    assert "httpGet" in spec["livenessProbe"]  # the HTTP port's own probe

    [service_port] = [p for p in find(objects, "Service", "reward")["spec"]["ports"] if p["name"] == "http"]
    url = f"http://{published(running, named[service_port['targetPort']])}"
    body = {"query": [PROMPT + ANSWER], "prompts": [PROMPT], "labels": ["1"]}
    reply = requests.post(f"{url}/get_reward", params={"rewards": "accuracy"}, json=body, timeout=60)
    assert reply.status_code == 200 and reply.json()["rewards"] == [1.0], reply.text
    metrics = requests.get(f"http://{published(running, named['metrics'])}/metrics", timeout=10).text
    assert counted(metrics)[("/get_reward", "POST", "200")] == 1
    assert counted(metrics)[("/health", "GET", "200")] >= 1  # the HTTP probe above
