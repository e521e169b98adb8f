"""Render the Kubernetes manifests in ``deploy/k8s`` with ``kubectl kustomize`` and pick them apart.

Shared by the manifest tests here and by the container tests, which start the images with exactly the
command, args, env and ports of the rendered Deployments::

    from tests.deploy.k8s_render import rendered_containers   # or import k8s_render from this folder
    for container in rendered_containers("cpu"):
        container["deployment"], container["image"], container["args"], container.get("env", [])

``kubectl`` (with its built-in kustomize) renders offline; renders are cached per process.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
# Every overlay users apply; each must render, validate and pass checkov.
OVERLAYS = ("cpu", "cpu-sandboxed", "gpu", "gpu-colocated")
# Kustomizations outside overlays/ that render on their own.
EXTRA_KUSTOMIZATIONS = {"pytorchjob": K8S_DIR / "pytorchjob"}
NAMESPACE = "grpo"


def kubectl() -> str:
    """Path of kubectl: on PATH, else the distribution's /usr/bin/kubectl."""
    found = shutil.which("kubectl") or "/usr/bin/kubectl"
    if not Path(found).exists():
        raise FileNotFoundError("kubectl is needed to render deploy/k8s (kubectl >= 1.27 includes kustomize)")
    return found


def kustomization_dir(name: str) -> Path:
    """Directory of an overlay (``cpu``, ``gpu``, ...) or of ``pytorchjob``."""
    if name in EXTRA_KUSTOMIZATIONS:
        return EXTRA_KUSTOMIZATIONS[name]
    path = K8S_DIR / "overlays" / name
    if not (path / "kustomization.yaml").is_file():
        raise ValueError(f"no overlay {name!r} under {K8S_DIR / 'overlays'}")
    return path


@functools.cache
def _render_text(name: str) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(kustomization_dir(name))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {name} failed:\n{result.stderr}")
    return result.stdout


def render_text(name: str) -> str:
    """The rendered multi-document YAML of an overlay (or ``pytorchjob``)."""
    return _render_text(name)


def render(name: str) -> list[dict[str, Any]]:
    """The rendered objects of an overlay, in kustomize's order (fresh copies: callers may mutate them)."""
    return [doc for doc in yaml.safe_load_all(_render_text(name)) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of that kind and name; KeyError when absent."""
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise KeyError(f"{kind}/{name} not rendered")


def deployments(name: str) -> dict[str, dict[str, Any]]:
    """Deployment name → Deployment of an overlay."""
    return {obj["metadata"]["name"]: obj for obj in render(name) if obj["kind"] == "Deployment"}


def rendered_containers(overlay: str) -> list[dict[str, Any]]:
    """Every container of every Deployment of ``overlay``, as rendered, plus where it came from.

    Each item is the container mapping of the manifest (``name``, ``image``, ``args``, ``env``, ``ports``,
    ``startupProbe``/``readinessProbe``/``livenessProbe``, ``resources``, ``securityContext``,
    ``volumeMounts``) with three added keys: ``deployment`` (its Deployment's name), ``pod_security_context``
    and ``volumes`` (the pod's, to resolve ``volumeMounts``). The images' entrypoint is ``python -m
    <service>``, so ``args`` are its arguments (``command`` is unset). ``env`` entries with ``valueFrom``
    (the admin token: Secret ``grpo-admin-token``, key ``token``) must be supplied by the caller.
    """
    return containers_of(render(overlay))


def containers_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`rendered_containers` of already rendered objects (an overlay plus components, say)."""
    containers = []
    for deployment in (obj for obj in objects if obj["kind"] == "Deployment"):
        deployment_name = deployment["metadata"]["name"]
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            item = copy.deepcopy(container)
            item["deployment"] = deployment_name
            item["pod_security_context"] = copy.deepcopy(pod.get("securityContext", {}))
            item["volumes"] = copy.deepcopy(pod.get("volumes", []))
            containers.append(item)
    return containers


def render_with_components(overlay: str, components: list[str], workdir: Path) -> list[dict[str, Any]]:
    """``overlay`` plus kustomize components (names under ``deploy/k8s/components``), rendered from a
    kustomization written in ``workdir`` (not cached)."""
    relative = Path(os.path.relpath(K8S_DIR, workdir))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(relative / "overlays" / overlay)],
        "components": [str(relative / "components" / name) for name in components],
    }
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    result = subprocess.run(
        [kubectl(), "kustomize", str(workdir)], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} + {components} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def config_files(overlay: str) -> dict[str, str]:
    """File name → text of the ``grpo-config`` ConfigMap (mounted at /etc/grpo) of an overlay."""
    return dict(find(render(overlay), "ConfigMap", "grpo-config")["data"])


def pytorchjob_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The PyTorchJob's replica templates as Pod objects, so Pod schemas and linters can check them."""
    pods = []
    for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
        template = copy.deepcopy(spec["template"])
        metadata = {
            **template.get("metadata", {}),
            "name": f"{job['metadata']['name']}-{role.lower()}",
            "namespace": job["metadata"].get("namespace", NAMESPACE),
        }
        pod_spec = {**template["spec"], "restartPolicy": spec.get("restartPolicy", "Never")}
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec})
    return pods
