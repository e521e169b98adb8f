"""The images started exactly as the rendered Kubernetes Deployments (cpu overlay) declare them: command,
args, env, ports, user, read-only root and volumes; every gRPC probe they declare then succeeds and the
metrics port answers."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc

import docker
from grpo_runtime.healthcheck import check
from tests.containers.service_containers import Running, wait_all_serving
from tests.deploy.k8s_render import config_files, rendered_containers

TOKEN = "manifest-test-token"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's env; the admin-token secret reference resolves to the test token."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["secretKeyRef"]["name"] == "grpo-admin-token", item
            env[item["name"]] = TOKEN
    return env


def mounts_of(container: dict[str, Any], host: dict[str, Path]) -> tuple[dict, dict]:
    """(bind volumes, tmpfs mounts) standing in for the pod's volumes."""
    kinds = {volume["name"]: volume for volume in container["volumes"]}
    volumes, tmpfs = {}, {}
    for mount in container.get("volumeMounts", []):
        volume = kinds[mount["name"]]
        if "emptyDir" in volume:
            tmpfs[mount["mountPath"]] = ""
        else:
            mode = "ro" if mount.get("readOnly") or "configMap" in volume or "secret" in volume else "rw"
            volumes[str(host[mount["name"]])] = {"bind": mount["mountPath"], "mode": mode}
    return volumes, tmpfs


@pytest.fixture(scope="module")
def host_volumes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pod")
    config = root / "config"
    config.mkdir()
    for name, text in config_files("cpu").items():
        (config / name).write_text(text)
    secret = root / "secret"
    secret.mkdir()
    (secret / "token").write_text(TOKEN)
    runs = root / "runs"
    runs.mkdir()
    runs.chmod(0o777)
    return {"config": config, "admin-token": secret, "runs": runs}


def run_as_rendered(spec: dict[str, Any], host: dict[str, Path]) -> Running:
    """Start a rendered container (:func:`tests.deploy.k8s_render.rendered_containers`) as its Deployment
    declares it, every port published on 127.0.0.1; not yet waited for."""
    security = spec["securityContext"]
    volumes, tmpfs = mounts_of(spec, host)
    container = docker.from_env().containers.run(
        spec["image"],
        command=spec.get("args"),
        entrypoint=spec.get("command"),
        environment=env_of(spec),
        ports={f"{p['containerPort']}/tcp": ("127.0.0.1", None) for p in spec["ports"]},
        user=f"{security['runAsUser']}:{spec['pod_security_context']['runAsGroup']}",
        read_only=security["readOnlyRootFilesystem"],
        cap_drop=security["capabilities"]["drop"],
        security_opt=["no-new-privileges:true"],
        volumes=volumes,
        tmpfs=tmpfs,
        detach=True,
    )
    return Running(container, spec["deployment"])


@pytest.fixture(scope="module")
def pods(images, host_volumes) -> Iterator[list[tuple[dict[str, Any], Running]]]:
    started: list[tuple[dict[str, Any], Running]] = []
    try:
        for spec in rendered_containers("cpu"):
            started.append((spec, run_as_rendered(spec, host_volumes)))
        wait_all_serving(running for _, running in started)
        yield started
    finally:
        for _, running in started:
            running.remove()


def published(running: Running, port: int) -> str:
    running.container.reload()
    [binding] = running.container.ports[f"{port}/tcp"]
    return f"127.0.0.1:{binding['HostPort']}"


def test_every_declared_probe_succeeds(pods):
    assert {spec["deployment"] for spec, _ in pods} == {"reward", "rollout", "trainer"}
    for spec, running in pods:
        for kind in PROBES:
            probe = spec[kind]["grpc"]
            target = published(running, probe["port"])
            assert check(target, probe.get("service", "")), (spec["deployment"], kind, running.logs()[-2000:])


def test_metrics_ports_answer(pods):
    for spec, running in pods:
        [metrics] = [p["containerPort"] for p in spec["ports"] if p.get("name", "").startswith("metrics")]
        url = f"http://{published(running, metrics)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200 and b"grpo_rpc" in response.read(), spec["deployment"]


def test_admin_rpcs_need_the_secret_token(pods):
    [(_, rollout)] = [(spec, r) for spec, r in pods if spec["deployment"] == "rollout"]
    with grpc.insecure_channel(published(rollout, 50052)) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Sleep(rollout_pb2.SleepRequest(level=1), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        status = stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=10)
        assert status.engine == "hf"
