"""The Kubernetes manifests in deploy/k8s: they render, validate against the Kubernetes schemas, pass checkov,
and follow the project's container conventions (commands, ports, probes, security, storage, network rules)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.k8s_render import (
    K8S_DIR,
    NAMESPACE,
    OVERLAYS,
    REPO_ROOT,
    config_files,
    deployments,
    find,
    pytorchjob_pods,
    render,
    render_text,
    rendered_containers,
)

# kubectl on these machines is 1.32; the newest schema kubernetes-validate ships covers current clusters.
K8S_VERSIONS = ("1.32.0", kubernetes_validate.latest_version())
# The gpu-colocated overlay shares one GPU between two containers through a DRA ResourceClaim, whose stable
# API (resource.k8s.io/v1) exists from Kubernetes 1.34.
MIN_VERSION = {"gpu-colocated": "1.34.0"}
ALL_RENDERS = (*OVERLAYS, "pytorchjob")

SERVICES = {
    "reward": {"port": 50051, "health": "grpo.reward.v1.RewardService"},
    "rollout": {"port": 50052, "health": "grpo.rollout.v1.RolloutService"},
    "trainer": {"port": 50053, "health": "grpo.trainer.v1.TrainerService"},
}


def _server_args(port: int) -> list[str]:
    return ["--host", "0.0.0.0", "--port", str(port), "--metrics-port", "9090"]


# The container commands fixed by the images' conventions (the container tests start exactly these).
EXPECTED_ARGS = {
    "reward": [*_server_args(50051), "--config", "/etc/grpo/reward.yaml"],
    "rollout": [
        *_server_args(50052),
        *("--model", "/opt/grpo/models/demo", "--engine", "hf", "--config", "/etc/grpo/rollout.yaml"),
    ],
    "trainer": [*_server_args(50053), "--config", "/etc/grpo/trainer.yaml"],
}


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _validate(doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        pytest.fail(f"{name} is invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


# ---------------------------------------------------------------- render and validate


@pytest.mark.parametrize("name", ALL_RENDERS)
def test_renders_into_the_grpo_namespace(name):
    objects = render(name)
    assert objects, f"{name} rendered nothing"
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "grpo-services", obj["metadata"]["name"]


@pytest.mark.parametrize("name", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_overlay_validates_against_kubernetes_schemas(name, version):
    if _version_tuple(version) < _version_tuple(MIN_VERSION.get(name, "0.0.0")):
        # Checked against the versions it targets instead: it must be refused for lacking the DRA v1 API.
        claim = find(render(name), "ResourceClaimTemplate", "single-gpu")
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(claim, version, strict=True)
        return
    for doc in render(name):
        _validate(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_pytorchjob_pod_templates_validate_as_pods(version):
    """kubernetes-validate has no schema for the PyTorchJob CRD: its pod templates are checked as Pods."""
    objects = render("pytorchjob")
    job = find(objects, "PyTorchJob", "grpo-train")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(job, version, strict=True)
    for doc in [*pytorchjob_pods(job), *(o for o in objects if o["kind"] != "PyTorchJob")]:
        _validate(doc, version)


# ---------------------------------------------------------------- checkov


@pytest.fixture(scope="module")
def checkov_report(checkov_bin, tmp_path_factory) -> dict[str, Any]:
    """One checkov run over every render (the PyTorchJob as Pods, which checkov can lint), keyed by file."""
    folder = tmp_path_factory.mktemp("rendered")
    for name in OVERLAYS:
        (folder / f"{name}.yaml").write_text(render_text(name))
    objects = render("pytorchjob")
    job_docs = [*pytorchjob_pods(find(objects, "PyTorchJob", "grpo-train")), *objects]
    (folder / "pytorchjob.yaml").write_text(yaml.safe_dump_all(job_docs))
    result = subprocess.run(
        [str(checkov_bin), "-d", str(folder), "--framework", "kubernetes", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # Exit status 1 = failed checks; the report says which.
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return report


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_RENDERS)
def test_checkov_passes(checkov_report, name):
    def mine(checks):
        return [c for c in checks if Path(c["file_path"]).name == f"{name}.yaml"]

    results = checkov_report["results"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in mine(results["failed_checks"])]
    assert not failed, "\n".join(failed)
    assert len(mine(results["passed_checks"])) > 50, "checkov linted (almost) nothing: did parsing fail?"
    skipped = {c["check_id"] for c in mine(results["skipped_checks"])}
    # Only the suppressions justified in the manifests (see test_every_checkov_suppression_is_justified).
    assert skipped <= {"CKV_K8S_15", "CKV_K8S_43", "CKV_K8S_35", "CKV_K8S_8", "CKV_K8S_9"}, skipped


def test_every_checkov_suppression_is_justified():
    """Each `checkov.io/skipN: CHECK=reason` has a reason and a comment above it saying why."""
    annotation = re.compile(r"^\s*checkov\.io/skip\d+:\s*(CKV2?_K8S_\d+)=(.+)$")
    found = 0
    for path in sorted(K8S_DIR.rglob("*.yaml")):
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            if "checkov.io/skip" not in line:
                continue
            found += 1
            match = annotation.match(line)
            assert match, f"{path}:{index + 1}: expected `checkov.io/skipN: CKV_K8S_NN=reason`"
            assert len(match.group(2).split()) >= 5, f"{path}:{index + 1}: the reason is too short"
            above = index - 1
            while above >= 0 and "checkov.io/skip" in lines[above]:
                above -= 1
            assert lines[above].strip().startswith("#"), f"{path}:{index + 1}: no comment justifying it"
    assert found >= 3


# ---------------------------------------------------------------- container conventions


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_follow_the_image_conventions(overlay):
    containers = rendered_containers(overlay)
    assert {c["name"] for c in containers} == set(SERVICES)
    for container in containers:
        service = container["name"]
        port = SERVICES[service]["port"]
        assert re.fullmatch(rf"grpo-services/{service}:(cpu|cuda)", container["image"]), container["image"]
        assert "command" not in container, "the image's entrypoint (python -m <service>) must stay"
        args = container["args"]
        assert args[args.index("--port") + 1] == str(port)
        assert args[args.index("--host") + 1] == "0.0.0.0"
        assert args[args.index("--config") + 1] == f"/etc/grpo/{service}.yaml"
        metrics = int(args[args.index("--metrics-port") + 1])
        ports = {p["containerPort"]: p for p in container["ports"]}
        assert set(ports) == {port, metrics} and all(p["protocol"] == "TCP" for p in ports.values())

        # Native gRPC probes on the service port: readiness for the service, startup/liveness overall.
        assert container["readinessProbe"]["grpc"] == {"port": port, "service": SERVICES[service]["health"]}
        for probe in ("startupProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == port
            assert container[probe]["grpc"].get("service", "") == ""
        assert (
            container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300
        )

        env = _by_name(container["env"])
        assert env["GRPO_ADMIN_TOKEN"]["valueFrom"] == {
            "secretKeyRef": {"name": "grpo-admin-token", "key": "token"}
        }

        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), (service, kind)

        security = container["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["seccompProfile"]["type"] in {"RuntimeDefault", "Localhost"}
        assert container["pod_security_context"]["runAsUser"] == 10001

        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = _by_name(container["volumes"])
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]], "writable /tmp must be an emptyDir"
        assert volumes[mounts["/etc/grpo"]["name"]]["configMap"]["name"] == "grpo-config"
        runs = mounts.get("/var/lib/grpo/runs")
        if service in ("trainer", "rollout"):
            assert runs and volumes[runs["name"]]["persistentVolumeClaim"]["claimName"] == "grpo-runs"
        if service == "trainer":
            assert not runs.get("readOnly", False), "the trainer writes runs and checkpoints"


def test_cpu_overlay_uses_exactly_the_conventional_args():
    for container in rendered_containers("cpu"):
        assert container["args"] == EXPECTED_ARGS[container["name"]]
        assert container["image"] == f"grpo-services/{container['name']}:cpu"


def test_gpu_overlay_puts_vllm_rollout_and_trainer_on_whole_gpus():
    containers = _by_name(rendered_containers("gpu"))
    assert containers["reward"]["image"] == "grpo-services/reward:cpu"
    expected_rollout = [a if a != "hf" else "vllm" for a in EXPECTED_ARGS["rollout"]]
    assert containers["rollout"]["args"] == expected_rollout
    for service in ("rollout", "trainer"):
        assert containers[service]["image"] == f"grpo-services/{service}:cuda"
        assert containers[service]["resources"]["limits"]["nvidia.com/gpu"] == 1
        mounts = {m["mountPath"]: m["name"] for m in containers[service]["volumeMounts"]}
        shm = _by_name(containers[service]["volumes"])[mounts["/dev/shm"]]["emptyDir"]
        assert shm["medium"] == "Memory"
    for name in ("rollout", "trainer"):
        pod = deployments("gpu")[name]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # No spare GPU for a surge pod.
    assert deployments("gpu")["rollout"]["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": 1,
    }


def test_gpu_colocated_overlay_shares_one_gpu_in_one_pod_with_sleep_mode():
    objects = render("gpu-colocated")
    assert set(deployments("gpu-colocated")) == {"reward", "trainer"}
    assert not [o for o in objects if o["metadata"]["name"].startswith("rollout")]
    pod = deployments("gpu-colocated")["trainer"]["spec"]["template"]["spec"]
    containers = _by_name(pod["containers"])
    assert set(containers) == {"trainer", "rollout"}
    claim = pod["resourceClaims"][0]
    assert find(objects, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
    for container in containers.values():
        assert container["resources"]["claims"] == [{"name": claim["name"]}], "both must use the same GPU"
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
    # One network namespace: the two metrics ports must differ.
    ports = [p["containerPort"] for c in containers.values() for p in c["ports"]]
    assert len(ports) == len(set(ports))
    assert "--engine" in containers["rollout"]["args"] and "vllm" in containers["rollout"]["args"]

    files = config_files("gpu-colocated")
    train = yaml.safe_load(files["train.yaml"])
    assert train["training"]["rollout"]["vllm_enable_sleep_mode"] is True
    assert train["services"]["rollout"] == "127.0.0.1:50052"
    assert yaml.safe_load(files["rollout.yaml"])["vllm"]["enable_sleep_mode"] is True


# ---------------------------------------------------------------- availability, scaling, network rules


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_reward_stays_available_during_rolling_updates(overlay):
    objects = render(overlay)
    reward = find(objects, "Deployment", "reward")
    assert reward["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert reward["spec"]["strategy"]["rollingUpdate"]["maxSurge"] >= 1
    assert reward["spec"]["replicas"] >= 2
    selector = reward["spec"]["selector"]["matchLabels"]
    assert find(objects, "PodDisruptionBudget", "reward")["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": selector},
    }
    hpa = find(objects, "HorizontalPodAutoscaler", "reward")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reward"}
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] > hpa["minReplicas"]
    # The trainer must never run twice over one run directory.
    assert find(objects, "Deployment", "trainer")["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(("overlay", "replicas"), [("cpu", 2), ("cpu-sandboxed", 2), ("gpu", 1)])
def test_rollout_replicas_are_published_by_a_headless_service(overlay, replicas):
    """The trainer follows the headless Service (dns:///), so every ready replica gets every weight version;
    the Deployment scales (2 replicas on CPU, one per GPU on the gpu overlay)."""
    objects = render(overlay)
    service = find(objects, "Service", "rollout-headless")["spec"]
    assert service["clusterIP"] == "None"
    # Only ready pods are listed: a replica still loading its model never gets a push or a shard.
    assert not service.get("publishNotReadyAddresses", False)
    rollout = find(objects, "Deployment", "rollout")["spec"]
    assert service["selector"] == rollout["selector"]["matchLabels"]
    assert service["ports"][0]["port"] == 50052
    assert rollout["replicas"] == replicas
    spread = rollout["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["labelSelector"]["matchLabels"] == rollout["selector"]["matchLabels"]
    train = yaml.safe_load(config_files(overlay)["train.yaml"])
    assert train["services"]["rollout"] == "dns:///rollout-headless.grpo.svc.cluster.local:50052"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_admit_only_the_intended_callers(overlay):
    objects = render(overlay)
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}

    def grpc_rule(spec, port):
        rules = [r for r in spec["ingress"] if {"protocol": "TCP", "port": port} in r["ports"]]
        assert len(rules) == 1
        return rules[0]["from"]

    # Score: any pod in the namespace; nothing leaves the reward pods (sandboxed code has no network).
    assert grpc_rule(policies["reward"], 50051) == [{"podSelector": {}}]
    assert policies["reward"]["egress"] == [] and "Egress" in policies["reward"]["policyTypes"]
    if overlay != "gpu-colocated":
        # Rollout (Generate and the weight/sleep admin RPCs): the trainer pods only.
        allowed = grpc_rule(policies["rollout"], 50052)
        assert allowed == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "trainer"}}}]
        # Out of rollout: DNS and the reward service's EnvironmentService (tool episodes), nothing else.
        rollout_egress = {
            (port["port"], *rule["to"][0]["podSelector"]["matchLabels"].values())
            for rule in policies["rollout"]["egress"]
            for port in rule["ports"]
        }
        assert rollout_egress == {(53, "kube-dns"), (50051, "reward")}
    trainer_egress_ports = {p["port"] for rule in policies["trainer"]["egress"] for p in rule["ports"]}
    assert trainer_egress_ports == {53, 50051, 50052}


def test_pytorchjob_launches_the_trainer_with_accelerate_across_nodes():
    objects = render("pytorchjob")
    job = find(objects, "PyTorchJob", "grpo-train")
    assert job["apiVersion"] == "kubeflow.org/v1"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    # accelerate's --multi_gpu needs >= 2 processes in all: at least one Worker node.
    assert specs["Worker"]["replicas"] >= 1
    for spec in specs.values():
        assert spec["restartPolicy"] == "OnFailure"
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "pytorch", "the Training Operator looks for the container named pytorch"
        assert container["image"] == "grpo-services/trainer:cuda"
        script = " ".join(container["command"] + container["args"])
        for piece in (
            "accelerate launch",
            '--num_machines "$WORLD_SIZE"',
            '--machine_rank "$RANK"',
            '--main_process_ip "$MASTER_ADDR"',
            "-m trainer_service train /etc/grpo/train.yaml",
        ):
            assert piece in script
        env = _by_name(container["env"])
        assert int(env["GPUS_PER_NODE"]["value"]) == container["resources"]["limits"]["nvidia.com/gpu"]
        labels = spec["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "trainer", "rollout admits trainer pods only"
        claims = {v["name"]: v for v in pod["volumes"]}
        assert claims["runs"]["persistentVolumeClaim"]["claimName"] == "grpo-runs"
        assert claims["config"]["configMap"]["name"] == "grpo-config"
    ranks = find(objects, "NetworkPolicy", "grpo-train-ranks")["spec"]
    assert ranks["podSelector"] == {"matchLabels": {"training.kubeflow.org/job-name": "grpo-train"}}


# ---------------------------------------------------------------- the configs the pods mount


@pytest.mark.slow
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mounted_configs_are_accepted_by_the_services(overlay, tmp_path):
    """The ConfigMap's files pass the services' own validation: server block, rollout settings, run config."""
    # Imported here, not at the top: rollout_service.settings pulls in torch (~10 s of CPU), which only
    # this slow test needs.
    from grpo_runtime.config import ServerConfig, load_config_file
    from reward_service.settings import load_settings as load_reward_settings
    from rollout_service.settings import RolloutSettings
    from trainer_service.config.rollout_targets import parse_target
    from trainer_service.config.run_config import parse_config
    from trainer_service.core.confinement import RunRoots, confine
    from trainer_service.settings import load_settings as load_trainer_settings

    files = config_files(overlay)
    assert set(files) == {"reward.yaml", "rollout.yaml", "trainer.yaml", "train.yaml"}
    settings = {}
    for service in SERVICES:
        path = tmp_path / f"{service}.yaml"
        path.write_text(files[f"{service}.yaml"])
        server, settings[service] = load_config_file(path)
        ServerConfig(**server)
    RolloutSettings.model_validate(settings["rollout"])
    load_reward_settings(settings["reward"])
    trainer = load_trainer_settings(settings["trainer"])
    run = parse_config(files["train.yaml"])
    assert run.output == "/var/lib/grpo/runs"
    assert run.services.admin_token_file == "/var/run/secrets/grpo/token"
    # StartRun refuses a run whose paths leave the trainer's roots. The token file exists only in the pod
    # (/var/run is /run there), so its root is checked apart.
    services = run.services.model_copy(update={"admin_token_file": None})
    confine(run.model_copy(update={"services": services}), RunRoots.of(trainer))
    assert any(Path("/run/secrets/grpo/token").is_relative_to(root) for root in trainer.secret_roots)
    # Read as a list of targets; the headless Service's name is resolved (not pinned) by the trainer.
    [target] = run.services.rollout
    assert parse_target(target).dynamic is (overlay != "gpu-colocated")


def test_sandboxed_overlay_uses_the_shipped_reward_seccomp_profile():
    """The Localhost profile named by the component is the one docker/ ships, and it allows namespaces."""
    (reward,) = [c for c in rendered_containers("cpu-sandboxed") if c["name"] == "reward"]
    profile = reward["securityContext"]["seccompProfile"]
    assert profile == {"type": "Localhost", "localhostProfile": "grpo/reward-sandbox.json"}
    shipped = json.loads((REPO_ROOT / "docker" / "seccomp" / "reward-sandbox.json").read_text())
    denied = {
        name for rule in shipped["syscalls"] for name in rule["names"] if rule["action"] != "SCMP_ACT_ALLOW"
    }
    assert shipped["defaultAction"] == "SCMP_ACT_ALLOW"
    assert not {"unshare", "clone", "clone3", "mount"} & denied, "the sandbox needs these"
    assert {"setns", "bpf", "ptrace", "init_module", "kexec_load"} <= denied
    # Everywhere else the runtime default applies.
    others = [c for c in rendered_containers("cpu-sandboxed") if c["name"] != "reward"]
    assert all(c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"} for c in others)


@pytest.mark.slow
@pytest.mark.parametrize("service", list(SERVICES))
def test_rendered_flags_are_accepted_by_the_service_cli(service):
    """Every flag the manifests pass (any overlay) is one `python -m <service>` knows, with a valid value."""
    result = subprocess.run(
        [sys.executable, "-m", f"{service}_service", "--help"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=REPO_ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    known = set(re.findall(r"--[a-z][a-z-]*", result.stdout))
    for overlay in OVERLAYS:
        for container in rendered_containers(overlay):
            if container["name"] != service:
                continue
            args = container["args"]
            flags = {arg for arg in args if arg.startswith("--")}
            assert flags <= known, f"{overlay}: {sorted(flags - known)} unknown to {service}_service"
            if "--engine" in args:
                assert re.search(rf"\b{args[args.index('--engine') + 1]}\b", result.stdout)
