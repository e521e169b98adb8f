"""The Node.js example client (examples/node/client.js) against a live reward service on 127.0.0.1.

The service runs as users start it (``python -m reward_service``, admin token from the environment); a tiny
token-classification PRM is loaded through the admin API, then the client lists the rewards and scores two
samples with weighted rule rewards and the PRM. Needs ``node`` (20+) and ``npm`` on PATH; ``npm ci`` runs once
when examples/node/node_modules is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = REPO_ROOT / "examples" / "node"
ADMIN_TOKEN = "node-client-test-token"
SERVING_LINE = re.compile(r"serving .*RewardService.* on 127\.0\.0\.1:(\d+)")

pytestmark = pytest.mark.slow


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: the Node.js client test needs Node.js 20+ and npm")
    return path


@pytest.fixture(scope="session")
def node_client() -> Path:
    """examples/node/client.js with its locked dependencies installed (``npm ci`` when missing)."""
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        subprocess.run([_tool("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=600)
    return NODE_DIR / "client.js"


@pytest.fixture(scope="module")
def reward_port(tmp_path_factory) -> Iterator[int]:
    """A reward service started with ``python -m reward_service`` on a free loopback port."""
    log_path = tmp_path_factory.mktemp("reward") / "reward.log"
    env = {**os.environ, "GRPO_ADMIN_TOKEN": ADMIN_TOKEN, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "reward_service", "--host", "127.0.0.1", "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
        )
    try:
        port = _wait_for_port(process, log_path, timeout_s=120)
        _wait_serving(port, timeout_s=30)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_port(process: subprocess.Popen, log_path: Path, timeout_s: float) -> int:
    """The port from the runtime's "serving ... on 127.0.0.1:PORT" log line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = SERVING_LINE.search(log_path.read_text())
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            pytest.fail(f"reward_service exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.2)
    pytest.fail(f"reward_service did not start within {timeout_s} s:\n{log_path.read_text()[-4000:]}")


def _wait_serving(port: int, timeout_s: float) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="grpo.reward.v1.RewardService")
        response = stub.Check(request, timeout=timeout_s, wait_for_ready=True)
        assert response.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def loaded_prm(reward_port, tiny_models) -> str:
    """Loads the tiny token-classification PRM under the name ``tiny`` through the admin API."""
    with grpc.insecure_channel(f"127.0.0.1:{reward_port}") as channel:
        admin = reward_pb2_grpc.RewardAdminServiceStub(channel)
        request = reward_pb2.LoadModelRequest(
            name="tiny", path=str(tiny_models["prm-token"]), kind=reward_pb2.MODEL_KIND_PRM
        )
        # The token is enforced: without it the admin RPC never reaches the service.
        with pytest.raises(grpc.RpcError) as refused:
            admin.LoadModel(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        admin.LoadModel(request, timeout=120, metadata=[("authorization", f"Bearer {ADMIN_TOKEN}")])
    return "tiny"


def _run_client(node_client: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_tool("node"), str(node_client), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={key: value for key, value in os.environ.items() if key != "GRPO_ADMIN_TOKEN"},
    )


def test_node_client_lists_rewards_and_scores_with_weights_metadata_and_a_prm(
    node_client, reward_port, loaded_prm
):
    result = _run_client(
        node_client,
        "--target",
        f"127.0.0.1:{reward_port}",
        "--prm",
        loaded_prm,
        "--request-id",
        "node-test-1",
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)

    rewards = {reward["name"]: reward for reward in output["rewards"]}
    assert {"accuracy", "format", f"prm:{loaded_prm}"} <= set(rewards)
    assert rewards["accuracy"]["required_metadata"] == ["answer"]
    assert any(param["name"] == "aggregate" for param in rewards[f"prm:{loaded_prm}"]["params"])

    correct, wrong = output["scores"]
    assert (correct["id"], wrong["id"]) == ("correct", "wrong")
    for score in (correct, wrong):
        components = {c["name"]: c for c in score["components"]}
        assert list(components) == ["accuracy", "format", f"prm:{loaded_prm}"], "request order"
        prm = components[f"prm:{loaded_prm}"]
        assert prm["error"] == "" and 0.0 <= prm["value"] <= 1.0
        assert prm["step_scores"] and all(0.0 <= s <= 1.0 for s in prm["step_scores"])
        # The metadata's gold answer decides accuracy; the weights (1.0, 0.5, 1.0) make the total.
        expected = 1.0 * components["accuracy"]["value"] + 0.5 * components["format"]["value"] + prm["value"]
        assert score["reward"] == pytest.approx(expected)
    correct_parts = {c["name"]: c["value"] for c in correct["components"]}
    wrong_parts = {c["name"]: c["value"] for c in wrong["components"]}
    assert (correct_parts["accuracy"], correct_parts["format"]) == (1.0, 1.0)
    assert (wrong_parts["accuracy"], wrong_parts["format"]) == (0.0, 0.0)


def test_node_client_reports_the_grpc_status_of_a_bad_request(node_client, reward_port):
    result = _run_client(node_client, "--target", f"127.0.0.1:{reward_port}", "--prm", "not-loaded")
    assert result.returncode == 1
    assert result.stderr.startswith("INVALID_ARGUMENT: rewards[2].name"), result.stderr


def test_node_client_scores_samples_from_a_file(node_client, reward_port, tmp_path):
    samples = [
        {"id": "boxed", "completion": "The answer is \\boxed{12}.", "metadata": {"answer": "12"}},
        {"id": "no-gold", "completion": "\\boxed{3}", "metadata": {}},
    ]
    path = tmp_path / "samples.json"
    path.write_text(json.dumps(samples))
    result = _run_client(node_client, "--target", f"127.0.0.1:{reward_port}", "--samples", str(path))
    assert result.returncode == 0, result.stderr
    boxed, no_gold = json.loads(result.stdout)["scores"]
    assert boxed["components"][0] == {"name": "accuracy", "value": 1.0, "step_scores": [], "error": ""}
    # A sample without the metadata the reward needs gets an error on that component, not an RPC error.
    assert no_gold["components"][0]["value"] is None and "answer" in no_gold["components"][0]["error"]
