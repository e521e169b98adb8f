"""Check the CUDA images on a machine without a GPU: each starts, imports its engine, answers ``--help`` and
serves its health check; write their sizes and build time to a results file.

``python scripts/check_cuda_images.py [--build] [--out bench/results/cuda_images.json]``

``--build`` runs ``docker/build_images.sh cuda`` first and times it (a first build fetches the CUDA wheels,
about 6 GB, from PyPI). Per image (``grpo-services/{reward,rollout,trainer}:cuda``):

* **imports**: ``torch`` (its version and the CUDA release it was built for) plus the image's engine:
  ``transformers`` (reward), ``vllm`` (rollout), ``trl`` and ``bitsandbytes`` (trainer);
  ``torch.cuda.is_available()`` is recorded (False here: no driver) but not required;
* **help**: the entrypoint's ``--help`` exits 0;
* **health**: the service started as its container starts it, except that the rollout service runs its HF
  engine on the shipped demo model (vLLM's CUDA engine needs a GPU), answers ``grpc.health.v1`` SERVING inside
  the container (``python -m grpo_runtime.healthcheck``) within ``--health-timeout`` seconds;
* **size**: ``docker image inspect``'s size in bytes.

Exits 1 when a check failed. The results file is written whole, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMAGES = {
    "reward": {"port": 50051, "modules": ["torch", "transformers"], "command": []},
    "rollout": {
        "port": 50052,
        "modules": ["torch", "vllm"],
        "command": [
            "--host",
            "0.0.0.0",
            "--port",
            "50052",
            "--model",
            "/opt/grpo/models/demo",
            "--engine",
            "hf",
        ],
    },
    "trainer": {"port": 50053, "modules": ["torch", "trl", "bitsandbytes"], "command": []},
}

IMPORT_PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    out[name] = getattr(module, "__version__", "?")
import torch
out["torch.version.cuda"] = torch.version.cuda
out["torch.cuda.is_available"] = torch.cuda.is_available()
print(json.dumps(out))
"""


def docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def check_imports(image: str, modules: list[str]) -> dict:
    result = docker("run", "--rm", "--entrypoint", "python", image, "-c", IMPORT_PROBE, *modules)
    if result.returncode != 0:
        return {"ok": False, "error": tail(result.stderr)}
    versions = json.loads(result.stdout.strip().splitlines()[-1])
    return {"ok": bool(versions["torch.version.cuda"]), "versions": versions}


def check_help(image: str) -> dict:
    result = docker("run", "--rm", image, "--help")
    return {"ok": result.returncode == 0, "exit_code": result.returncode, "first_line": result.stdout[:120]}


def check_health(image: str, port: int, command: list[str], timeout_s: float) -> dict:
    name = f"grpo-cuda-check-{image.split('/')[-1].replace(':', '-')}-{os.getpid()}"
    started = docker("run", "-d", "--name", name, "--network", "none", image, *command)
    if started.returncode != 0:
        return {"ok": False, "error": tail(started.stderr)}
    begin = time.monotonic()
    try:
        while time.monotonic() - begin < timeout_s:
            probe = docker(
                "exec", name, "python", "-m", "grpo_runtime.healthcheck", "--port", str(port), timeout=30
            )
            if probe.returncode == 0:
                return {"ok": True, "serving_after_s": round(time.monotonic() - begin, 1)}
            if docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() != "true":
                return {"ok": False, "error": "exited: " + tail(docker("logs", name).stderr)}
            time.sleep(2)
        return {
            "ok": False,
            "error": f"not SERVING after {timeout_s:.0f} s: " + tail(docker("logs", name).stderr),
        }
    finally:
        docker("rm", "-f", name)


def image_size(image: str) -> int | None:
    result = docker("image", "inspect", "-f", "{{.Size}}", image)
    return int(result.stdout.strip()) if result.returncode == 0 else None


def build() -> dict:
    start = time.monotonic()
    result = subprocess.run(
        [str(ROOT / "docker/build_images.sh"), "cuda"], cwd=ROOT, capture_output=True, text=True
    )
    return {
        "ok": result.returncode == 0,
        "seconds": round(time.monotonic() - start, 1),
        "output_tail": tail(result.stdout + result.stderr, 12),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="build the images first (timed)")
    parser.add_argument(
        "--build-seconds",
        type=float,
        default=None,
        help="record the time of a build timed outside this script",
    )
    parser.add_argument("--repository", default="grpo-services", help="images are REPOSITORY/<service>:cuda")
    parser.add_argument("--health-timeout", type=float, default=240.0, help="seconds to wait for SERVING")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cuda_images.json")
    args = parser.parse_args()

    report: dict = {
        "machine": {"cpus": os.cpu_count(), "gpu": False, "kernel": platform.release()},
        "load_average_1m_at_start": os.getloadavg()[0],
    }
    if args.build:
        report["build"] = build()
    elif args.build_seconds is not None:
        report["build"] = {"ok": True, "seconds": args.build_seconds, "timed": "outside this script"}
    images = {}
    for service, spec in IMAGES.items():
        image = f"{args.repository}/{service}:cuda"
        size = image_size(image)
        if size is None:
            images[service] = {"ok": False, "error": f"{image} is not built (make images-cuda)"}
            continue
        checks = {
            "imports": check_imports(image, spec["modules"]),
            "help": check_help(image),
            "health": check_health(image, spec["port"], spec["command"], args.health_timeout),
        }
        images[service] = {"size_bytes": size, "size_gb": round(size / 1e9, 2), **checks}
        images[service]["ok"] = all(check["ok"] for check in checks.values())
        print(f"{'PASS' if images[service]['ok'] else 'FAIL'} {image} ({size / 1e9:.2f} GB)", flush=True)
    report["images"] = images
    report["load_average_1m_at_end"] = os.getloadavg()[0]
    ok = all(entry["ok"] for entry in images.values()) and report.get("build", {}).get("ok", True)
    report["ok"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
