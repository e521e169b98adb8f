"""Property-based fuzzing of every TrainerService RPC against a real server on loopback: random YAML text,
random run configs (real keys down to the leaves of every block, hostile values and paths), random run ids.
Every answer is OK or a client-error status (never INTERNAL or UNKNOWN), and the server stays SERVING.

No fuzzed run trains: the service allows one live run and a "blocker" run holds that slot for the whole
module (its reward service is a closed loopback port it keeps retrying), so a StartRun that passes every check
gets RESOURCE_EXHAUSTED, after the YAML, the config and the paths have all been validated. Every service
address in the fuzzed configs is a closed loopback port, so no traffic leaves the machine either way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_runtime.client import create_sync_channel
from tests.integration.trainer.fixtures import confined_settings
from tests.support.server_thread import server_thread
from trainer_service.config.key_paths import config_keys
from trainer_service.config.training import TrainingConfig
from trainer_service.local.launcher import free_port
from trainer_service.server import build

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}
# Modest by default (the module runs in well under a minute once the server is up); more for a long hunt.
FUZZ = settings(
    max_examples=int(os.environ.get("GRPO_FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CLOSED = f"127.0.0.1:{free_port()}"  # nothing listens here
# The keys of the training block as dotted paths inside it: those that hold a value
# (``optimizer.learning_rate``, ``tools.environments[].name``) and the blocks that hold them.
TRAINING_LEAF_KEYS = sorted(key.path for key in config_keys(TrainingConfig) if key.block is None)
TRAINING_BLOCK_KEYS = sorted(key.path for key in config_keys(TrainingConfig) if key.block is not None)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "secrets").mkdir()
    (root / "secrets" / "token").write_text("t0ken\n")
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


@pytest.fixture(scope="module")
def channel(root, tiny_models):
    settings = confined_settings(root, max_concurrent_runs=1, stop_grace_s=1)
    with server_thread(lambda: build(settings)) as server, create_sync_channel(server.address) as channel:
        blocker = {
            "base": str(tiny_models["policy"]),
            "output": str(root / "runs"),
            "experiment_name": "blocker",
            "data": {"train": str(root / "train.jsonl")},
            "services": {"reward": CLOSED, "rollout": CLOSED, "retry_timeout_s": 600},
        }
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        stub.StartRun(trainer_pb2.StartRunRequest(config_yaml=yaml.safe_dump(blocker), run_id="blocker"))
        yield channel


def call(method, request, **kwargs):
    """The status code of one call (a streaming call is read to its end)."""
    try:
        reply = method(request, timeout=30, **kwargs)
        if not hasattr(reply, "ListFields"):
            for _ in reply:
                pass
    except grpc.RpcError as error:
        assert error.code() in ALLOWED, f"{error.code().name}: {error.details()}"
        return error.code()
    return grpc.StatusCode.OK


def serving(channel) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)
scalars = st.none() | st.booleans() | numbers | st.text(max_size=30)
trees = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)
run_ids = st.text(max_size=80) | st.sampled_from(["", "blocker", "a", "../x", "x" * 65, "y" * 100_000])


def paths(root: Path):
    """Paths a hostile caller would try, and some that are fine."""
    return st.sampled_from(
        [
            "/etc/passwd",
            "/dev/zero",
            "/dev/null",
            "/proc/self/environ",
            "/tmp",
            "../../etc",
            "runs/../../x",
            "",
            ".",
            "a\x00b",
            str(root / "runs"),
            str(root / "runs" / "x"),
            str(root / "train.jsonl"),
            str(root / "secrets" / "token"),
            str(root / "secrets"),
            str(root / ".." / "elsewhere"),
            "/" + "q" * 100_000,  # its error must still fit the status
        ]
    ) | st.text(max_size=40)


def set_key(config: dict, path: str, value: object) -> None:
    """Set the dotted ``path`` in ``config``, making the blocks on the way; ``name[]`` is the first entry of
    the list ``name`` (``tools.environments[].name`` → ``{"tools": {"environments": [{"name": value}]}}``)."""
    *parents, leaf = path.split(".")
    node = config
    for name in parents:
        node = node.setdefault(name[:-2], [{}])[0] if name.endswith("[]") else node.setdefault(name, {})
    node[leaf] = value


@st.composite
def run_configs(draw, root: Path) -> dict:
    """A config with the real keys (a random subset of the training block's leaf keys, maybe a whole block)
    and random values."""
    values = trees | st.sampled_from([0, 1, -1, 0.5, 1e300, "standard"])
    training: dict = {}
    for path in draw(st.lists(st.sampled_from(TRAINING_LEAF_KEYS), max_size=6, unique=True)):
        set_key(training, path, draw(values))
    if draw(st.booleans()):
        set_key(training, draw(st.sampled_from(TRAINING_BLOCK_KEYS)), draw(values))  # a block as one value
    config = {
        "base": draw(paths(root)),
        "output": draw(paths(root)),
        "data": {"train": draw(paths(root))},
        "training": training,
        "services": {"reward": CLOSED, "rollout": CLOSED},
    }
    if draw(st.booleans()):
        config["experiment_name"] = draw(paths(root))
    if draw(st.booleans()):
        config["data"]["eval"] = draw(paths(root))
    if draw(st.booleans()):
        config["services"]["admin_token_file"] = draw(paths(root))
    if draw(st.booleans()):
        config["services"]["tls_ca_file"] = draw(paths(root))
    if draw(st.booleans()):
        config[draw(st.text(max_size=8))] = draw(trees)  # an unknown key
    return config


def dump(config: dict) -> str:
    # NaN and infinities are written as YAML's .nan / .inf; a key YAML cannot write is dropped.
    try:
        return yaml.safe_dump(config, allow_unicode=True)
    except yaml.YAMLError:
        return "{}"


@FUZZ
@given(text=st.text(max_size=2000) | trees.map(dump), run_id=run_ids, resume=st.booleans())
def test_start_run_random_yaml(channel, text, run_id, resume):
    stub = trainer_pb2_grpc.TrainerServiceStub(channel)
    call(stub.StartRun, trainer_pb2.StartRunRequest(config_yaml=text, run_id=run_id, resume=resume))
    serving(channel)


@FUZZ
@given(data=st.data(), resume=st.booleans())
def test_start_run_random_configs(channel, root, data, resume):
    stub = trainer_pb2_grpc.TrainerServiceStub(channel)
    config = data.draw(run_configs(root))
    code = call(stub.StartRun, trainer_pb2.StartRunRequest(config_yaml=dump(config), resume=resume))
    # The blocker holds the only slot: nothing may start.
    assert code != grpc.StatusCode.OK
    serving(channel)


@FUZZ
@given(run_id=run_ids)
def test_run_queries_with_random_ids(channel, run_id):
    stub = trainer_pb2_grpc.TrainerServiceStub(channel)
    expected = {"blocker": grpc.StatusCode.OK, "": grpc.StatusCode.INVALID_ARGUMENT}
    get = call(stub.GetRun, trainer_pb2.GetRunRequest(run_id=run_id))
    assert get == expected.get(run_id, grpc.StatusCode.NOT_FOUND)
    if run_id != "blocker":  # the blocker's stream would last as long as it does
        call(stub.WatchRun, trainer_pb2.WatchRunRequest(run_id=run_id))
        call(stub.StopRun, trainer_pb2.StopRunRequest(run_id=run_id))
    listed = stub.ListRuns(trainer_pb2.ListRunsRequest(), timeout=30).runs
    assert [run.run_id for run in listed] == ["blocker"]
    serving(channel)
